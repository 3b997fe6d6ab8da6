package fsutil

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteNew_WritesOnceWithItsMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key.pem")
	if err := WriteNew(path, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	if err := WriteNew(path, []byte("second"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("a second write over the file: %v, want it refused as existing", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "first" {
		t.Fatalf("the file holds %q after a refused write, want %q", b, "first")
	}
}
