package pgstore

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/idemproxy/idemproxy/store"
)

// defaultListLimit is List's page size when the caller gives none.
const defaultListLimit = 100

// List implements store.Store.List in (tenant, key) order; the cursor is the
// last (tenant, key) returned, encoded.
func (s *Store) List(ctx context.Context, state store.State, cursor string, limit int) ([]store.Record, string, error) {
	if limit <= 0 {
		limit = defaultListLimit
	}
	after, err := decodeCursor(cursor)
	if err != nil {
		return nil, "", fmt.Errorf("pgstore: list: %w", err)
	}
	var out []store.Record
	err = s.call(ctx, "list", nil, func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, `SELECT `+columns+` FROM idemproxy_records
			WHERE state = $1 AND `+live+` AND (tenant, key) > ($2, $3)
			ORDER BY tenant, key LIMIT $4`, int16(state), []byte(after.Tenant), []byte(after.Key), limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		out = out[:0]
		for rows.Next() {
			rec, err := readRecord(rows)
			if err != nil {
				return err
			}
			out = append(out, rec)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) == limit {
		next = encodeCursor(out[len(out)-1].ID)
	}
	return out, next, nil
}

// encodeCursor is hex(uvarint(len(tenant)) tenant key).
func encodeCursor(id store.ID) string {
	b := binary.AppendUvarint(nil, uint64(len(id.Tenant)))
	b = append(b, id.Tenant...)
	return hex.EncodeToString(append(b, id.Key...))
}

func decodeCursor(c string) (store.ID, error) {
	if c == "" {
		return store.ID{}, nil
	}
	b, err := hex.DecodeString(c)
	if err != nil {
		return store.ID{}, store.ErrBadCursor
	}
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return store.ID{}, store.ErrBadCursor
	}
	b = b[k:]
	return store.ID{Tenant: string(b[:n]), Key: string(b[n:])}, nil
}

// Supersede implements store.Store.Supersede.
func (s *Store) Supersede(ctx context.Context, id store.ID) (store.Record, error) {
	var rec store.Record
	err := s.call(ctx, "supersede", &id, func(ctx context.Context) error {
		r, err := readRecord(s.pool.QueryRow(ctx, `UPDATE idemproxy_records SET superseded = true, expires_at = NULL
			WHERE tenant = $1 AND key = $2 AND state = 2 AND `+live+` RETURNING `+columns,
			[]byte(id.Tenant), []byte(id.Key)))
		if err == nil {
			rec = r
			return nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		cur, err := s.get(ctx, id)
		if err != nil {
			return err
		}
		return fmt.Errorf("%w: record is %s", store.ErrNotFinal, cur.State)
	})
	return rec, err
}
