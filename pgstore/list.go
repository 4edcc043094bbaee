package pgstore

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/store"
)

// defaultListLimit is List's page size when the caller gives none.
const defaultListLimit = 100

// List implements store.Store.List in (tenant, key) order; the cursor is the
// last (tenant, key) returned, encoded. Records f.Keep leaves out are read
// past in batches, each its own call, until the page is full or the rows end.
// A batch is bounded in bytes as well as in rows (listBatch), so that what
// is read to judge and dropped, a thousand stored answers of up to
// MaxRecordBytes each, is never held at once; the page is bounded by
// store.MaxListBytes. Without f.Bodies, the body columns are not fetched
// (listColumns), but for a final answer's body that may need review, which
// is judged and dropped (store.Response.WithoutBody); batches and pages are
// cut by what is fetched and kept. A row that does not decode (scanRecord) is listed as
// store.Record.Unreadable instead of failing the page, and one in a state
// this version does not know (a newer version's) is listed with the
// unknown records so: its operation may have reached the provider.
// Past f.Budget, the page ends after a batch with a row read past.
func (s *Store) List(ctx context.Context, f store.Filter, cursor string, limit int) ([]store.Record, string, error) {
	if limit <= 0 {
		limit = defaultListLimit
	}
	after, err := decodeCursor(cursor)
	if err != nil {
		return nil, "", fmt.Errorf("pgstore: list: %w", err)
	}
	batch := limit
	if f.Keep != nil {
		batch = max(limit, filterBatch)
	}
	var out []store.Record
	size := 0 // what out's records hold
	began := time.Now()
	for {
		rows, cut, err := s.listBatch(ctx, f.State, after, batch, f.Bodies)
		if err != nil {
			return nil, "", err
		}
		skipped := false // a row of the batch read past: the budget is for those
		for i := range rows {
			if f.Keep != nil && rows[i].Unreadable == nil && !f.Keep(&rows[i]) {
				skipped = true
				continue
			}
			n := rows[i].Size()
			if len(out) > 0 && size+n > store.MaxListBytes {
				return out, encodeCursor(out[len(out)-1].ID), nil // this row starts the next page
			}
			out, size = append(out, rows[i]), size+n
			if len(out) == limit {
				return out, encodeCursor(rows[i].ID), nil
			}
		}
		if len(rows) < batch && !cut {
			return out, "", nil
		}
		after = rows[len(rows)-1].ID
		if skipped && f.Budget > 0 && time.Since(began) >= f.Budget {
			return out, encodeCursor(after), nil // the next call starts after the batch read
		}
	}
}

// filterBatch is how many rows a filtered List reads per call, at most.
const filterBatch = 500

// rowBytes is about what a row holds in its variable-length columns, as
// store.Record.Size counts it, with the bodies (or without: listedBytes).
// octet_length of a column stored out of line (TOAST) is read from its
// pointer: the values are not fetched to be measured.
const rowBytes = `(octet_length(tenant) + octet_length(key) + octet_length(fingerprint) + octet_length(owner)
	+ coalesce(octet_length(header), 0) + coalesce(octet_length(body), 0) + coalesce(octet_length(last_body), 0)
	+ coalesce(octet_length(sent_body), 0) + coalesce(octet_length(sent_type), 0) + coalesce(octet_length(sent_encoding), 0)
	+ coalesce(octet_length(method), 0) + coalesce(octet_length(path), 0) + coalesce(octet_length(upstream_key), 0)
	+ octet_length(last_error))`

// mayNeedReview is what store.NeedsReview checks of a body before it
// parses it: the body holds "needs_review" or a \u escape (the bytes in hex,
// so that no quoting setting matters). A body without either does not need
// review; one with either is fetched to be judged (listColumns).
const mayNeedReview = `(position(decode('6e656564735f726576696577', 'hex') IN body) > 0 OR position(decode('5c75', 'hex') IN body) > 0)`

// listedBytes is rowBytes of a row as List fetches it without bodies: no
// last_body nor request as sent, and the body only where it may need review.
const listedBytes = `(octet_length(tenant) + octet_length(key) + octet_length(fingerprint) + octet_length(owner)
	+ coalesce(octet_length(header), 0) + CASE WHEN ` + mayNeedReview + ` THEN octet_length(body) ELSE 0 END
	+ coalesce(octet_length(method), 0) + coalesce(octet_length(path), 0) + coalesce(octet_length(upstream_key), 0)
	+ octet_length(last_error))`

// listColumns is columns as List fetches them: with bodies, columns;
// without, last_body NULL, no request as sent, and body NULL where it does
// not need review (mayNeedReview), so that scanRecord reads the same row
// shape.
func listColumns(bodies bool) string {
	if bodies {
		return columns
	}
	return withoutBodies
}

var withoutBodies = func() string {
	c := strings.Replace(columns, " body,", " CASE WHEN "+mayNeedReview+" THEN body END,", 1)
	c = strings.Replace(c, " last_body,", " NULL::bytea,", 1)
	c = strings.Replace(c, sentColumns, "false, NULL::bytea, NULL::text, NULL::text", 1)
	if strings.Count(c, "body") != strings.Count(columns, "body")-1 { // two more in mayNeedReview, last_body and sentColumns' two gone
		panic("pgstore: listColumns: columns changed: " + columns)
	}
	return c
}()

// listBatch returns up to n live records in state after the (tenant, key)
// after, in order (for store.Unknown, those in a state this version does
// not know too), and no more of them than reach store.MaxListBytes by
// rowBytes (listedBytes without bodies, as listColumns fetches them): each
// row is returned only while the rows before it hold less (so the first
// always is), which the database decides from the rows' sizes before it
// sends any. cut reports that the last row returned
// reached it: rows may follow, though fewer than n were returned.
func (s *Store) listBatch(ctx context.Context, state store.State, after store.ID, n int, bodies bool) (out []store.Record, cut bool, err error) {
	size := rowBytes
	if !bodies {
		size = listedBytes
	}
	type batch struct {
		rows []store.Record
		cut  bool
	}
	err = s.call(ctx, "list", nil, func(ctx context.Context) error {
		// A caller who leaves mid-statement costs no connection (see read).
		b, err := read(ctx, s, func(ctx context.Context, conn *pgxpool.Conn) (batch, error) {
			// The state is written into the statement, not passed: a plan
			// made once for any state (see Open) could not use the
			// open-records index for in-flight and unknown records. The
			// innermost query is the plain page (ORDER BY … LIMIT); the
			// running sum is taken over its rows only.
			rows, err := conn.Query(ctx, `SELECT `+listColumns(bodies)+`, before + bytes FROM (
				SELECT p.*, sum(bytes) OVER (ORDER BY tenant, key ROWS UNBOUNDED PRECEDING) - bytes AS before FROM (
					SELECT r.*, `+size+` AS bytes FROM idemproxy_records r
					WHERE `+inState(state)+` AND `+live+` AND (tenant, key) > ($1, $2)
					ORDER BY tenant, key LIMIT $3) p) w
				WHERE before < $4 ORDER BY tenant, key`, []byte(after.Tenant), []byte(after.Key), n, int64(store.MaxListBytes))
			if err != nil {
				return batch{}, err
			}
			defer rows.Close()
			var b batch
			for rows.Next() {
				var through int64
				rec, err := scanRecord(withExtra{rows, &through})
				if err != nil {
					return batch{}, err
				}
				if !bodies {
					rec.Response = rec.Response.WithoutBody() // judged, dropped
				}
				b.rows = append(b.rows, rec)
				b.cut = through >= store.MaxListBytes
			}
			return b, rows.Err()
		})
		out, cut = b.rows, b.cut
		return err
	})
	return out, cut, err
}

// withExtra scans a row of columns and one more column, into extra.
type withExtra struct {
	pgx.Row
	extra any
}

func (r withExtra) Scan(dest ...any) error { return r.Row.Scan(append(dest, r.extra)...) }

// inState is the condition of the rows List lists for state: those in it,
// and for store.Unknown those in a state this version does not know, which
// are listed as unreadable (no one else lists them, and no request or
// sweep of this version settles them). Both arms imply the open-records
// index's condition (state <> 2), so the planner may still use that index.
func inState(state store.State) string {
	if state == store.Unknown {
		return `(state >= 3 OR state < 1)`
	}
	return `state = ` + strconv.Itoa(int(int16(state)))
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

// Supersede implements store.Store.Supersede: in one transaction, the row is
// locked and checked to be owner's claim and not superseded yet (a second
// renew that read it before the first wrote waits for the lock and then
// sees the first's write), then updated only while it is final.
func (s *Store) Supersede(ctx context.Context, id store.ID, owner string) (store.Record, error) {
	claim := func(cur store.Record) error {
		if cur.Owner != owner {
			return fmt.Errorf("%w: record is another claim's", store.ErrNotOwner)
		}
		if cur.State == store.Final && cur.Superseded {
			return store.ErrSuperseded // another renew moved the order on first
		}
		return nil
	}
	return s.edit(ctx, "supersede", id, claim, store.ErrNotFinal, `UPDATE idemproxy_records SET superseded = true, expires_at = NULL
		WHERE tenant = $1 AND key = $2 AND state = 2 AND owner = $3 AND `+live+` RETURNING `+columns,
		[]byte(id.Tenant), []byte(id.Key), owner)
}

// Resolve implements store.Store.Resolve with one statement whose condition
// is that the record is unknown: a Begin that resumed it first leaves it in
// flight, and the statement then changes nothing.
func (s *Store) Resolve(ctx context.Context, id store.ID, resp *store.Response) (store.Record, error) {
	sql, args := `DELETE FROM idemproxy_records WHERE tenant = $1 AND key = $2 AND state = 3 RETURNING `+columns,
		[]any{[]byte(id.Tenant), []byte(id.Key)}
	if resp != nil {
		header, err := json.Marshal(resp.Header)
		if err != nil {
			return store.Record{}, fmt.Errorf("pgstore: resolve: header: %w", err)
		}
		if n := int64(len(header) + len(resp.Body)); n > s.opt.MaxRecordBytes {
			return store.Record{}, fmt.Errorf("pgstore: resolve: %w: %d bytes, limit %d", store.ErrTooLarge, n, s.opt.MaxRecordBytes)
		}
		if resp.Status < 0 || resp.Status > math.MaxInt32 {
			return store.Record{}, fmt.Errorf("pgstore: resolve: status %d out of range", resp.Status)
		}
		// As Complete writes a final answer (see completesFrom).
		sql = `UPDATE idemproxy_records SET state = 2, lease_until = NULL,
			status = $3, header = $4, body = $5, last_body = NULL,
			sent_body = NULL, sent_type = NULL, sent_encoding = NULL,
			expires_at = CASE WHEN $6::bigint = 0 THEN NULL ELSE now() + $6 * interval '1 microsecond' END
			WHERE tenant = $1 AND key = $2 AND state = 3 RETURNING ` + columns
		final := store.Record{State: store.Final, Response: *resp} // what the row becomes
		args = append(args, int32(resp.Status), header, nonNil(resp.Body), s.expiry(&final))
	}
	return s.edit(ctx, "resolve", id, nil, store.ErrNotUnknown, sql, args...)
}

// Reviewed implements store.Store.Reviewed: whether the answer needs
// review is read in Go (store.NeedsReview), so the record is read first,
// locked, and marked in the same transaction.
func (s *Store) Reviewed(ctx context.Context, id store.ID) (store.Record, bool, error) {
	var rec store.Record
	var marked bool
	err := s.call(ctx, "reviewed", &id, func(ctx context.Context) error {
		marked = false
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			cur, err := readRecord(tx.QueryRow(ctx, `SELECT `+columns+` FROM idemproxy_records
				WHERE tenant = $1 AND key = $2 AND `+live+` FOR UPDATE`, []byte(id.Tenant), []byte(id.Key)))
			switch {
			case err != nil:
				return err
			case cur.State != store.Final:
				return fmt.Errorf("%w: record is %s", store.ErrNotFinal, cur.State)
			case !store.NeedsReview(cur.Response.Body):
				return store.ErrNoReview
			case cur.Reviewed:
				rec = cur // marked already: its expiry stays
				return nil
			}
			cur.Reviewed = true
			rec, err = readRecord(tx.QueryRow(ctx, `UPDATE idemproxy_records SET reviewed = true,
				expires_at = CASE WHEN $3::bigint = 0 THEN NULL ELSE now() + $3 * interval '1 microsecond' END
				WHERE tenant = $1 AND key = $2 RETURNING `+columns, []byte(id.Tenant), []byte(id.Key), s.expiry(&cur)))
			marked = err == nil
			return err
		})
	})
	return rec, marked && err == nil, err
}

// edit runs an operator's change to id's record (Supersede, Resolve): in
// one transaction, the record is read and locked, then changed by one
// statement, sql with args, whose condition is the state the change needs
// and which returns the record's columns. A missing record is
// store.ErrNotFound, one that does not read store.ErrUnreadable (nothing is
// written: the statement could replace or delete what cannot be read), one
// that check (when not nil) refuses as locked is refused with its error, and
// one in another state is refused with wrong.
func (s *Store) edit(ctx context.Context, op string, id store.ID, check func(store.Record) error, wrong error, sql string, args ...any) (store.Record, error) {
	var rec store.Record
	err := s.call(ctx, op, &id, func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			cur, err := readRecord(tx.QueryRow(ctx, `SELECT `+columns+` FROM idemproxy_records
				WHERE tenant = $1 AND key = $2 AND `+live+` FOR UPDATE`, []byte(id.Tenant), []byte(id.Key)))
			if err != nil {
				return err
			}
			if check != nil {
				if err := check(cur); err != nil {
					return err
				}
			}
			r, err := readRecord(tx.QueryRow(ctx, sql, args...))
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("%w: record is %s", wrong, cur.State)
			}
			rec = r
			return err
		})
	})
	return rec, err
}

// Discard implements store.Store.Discard: in one transaction, the row is
// locked and read, and deleted only if it does not decode (scanRecord);
// a readable row is left as it is.
func (s *Store) Discard(ctx context.Context, id store.ID) (store.Record, error) {
	var rec store.Record
	err := s.call(ctx, "discard", &id, func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			cur, err := scanRecord(tx.QueryRow(ctx, `SELECT `+columns+` FROM idemproxy_records
				WHERE tenant = $1 AND key = $2 AND `+live+` FOR UPDATE`, []byte(id.Tenant), []byte(id.Key)))
			switch {
			case err != nil:
				return err
			case cur.Unreadable == nil:
				return store.ErrReadable
			}
			if _, err := tx.Exec(ctx, `DELETE FROM idemproxy_records WHERE tenant = $1 AND key = $2`,
				[]byte(id.Tenant), []byte(id.Key)); err != nil {
				return err
			}
			rec = cur
			return nil
		})
	})
	return rec, err
}
