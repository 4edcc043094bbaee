//go:build unix

package main

import "syscall"

// ownerOnlyFiles makes every file and directory the process creates from
// now on its user's only (umask 077). The store's files hold every stored
// answer (a card issue's among them), and Badger creates them with mode
// 0666 less the umask: 0644 under the usual 022, readable by any user of
// the host in a data directory the operator made with mkdir (0755) or in
// the image's /data (1777).
func ownerOnlyFiles() { syscall.Umask(0o077) }
