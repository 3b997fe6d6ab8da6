// Package fsutil holds the file writes several packages need done the
// same careful way.
package fsutil

import "os"

// WriteNew creates path (failing if it exists), writes b to it with the
// given mode and syncs it before closing, so that what it returns nil
// for is on disk whole.
func WriteNew(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
