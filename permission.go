package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/caarlos0/env/v11"
)

// denied adds to err, when it is a "permission denied" on a file or
// directory the operator provides, the user idemproxy runs as and what gives
// it access. In the image that user is 65532, not the owner of a directory
// bind-mounted on /data or of a secret file made by root, and the error alone
// names neither. fix is a format with the uid as %[1]d and the gid as %[2]d.
// Any other error is returned as it is.
func denied(err error, access, fix string) error {
	cause := err
	var fe env.LoadFileContentError // a <NAME>_FILE; it does not unwrap
	if errors.As(err, &fe) {
		cause = fe.Err
	}
	if err == nil || !errors.Is(cause, fs.ErrPermission) {
		return err
	}
	uid, gid := os.Getuid(), os.Getgid()
	return fmt.Errorf("%w; idemproxy runs as uid %d (gid %d), which may not %s: %s",
		err, uid, gid, access, fmt.Sprintf(fix, uid, gid))
}
