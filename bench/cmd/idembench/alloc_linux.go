package main

import (
	"io/fs"
	"syscall"
)

// allocated is the disk space a file takes (st_blocks, 512-byte units).
func allocated(info fs.FileInfo) int64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return info.Size()
}
