package taskpush_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The Go worker of docs/worker.md is under 30 lines and builds as a module of
// its own that uses this one the way the page says (require and replace).
func TestDocsWorkerBuilds(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(sourceRoot(), "docs", "worker.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Go\n")
	if !ok {
		t.Fatal("docs/worker.md has no '## Go' section")
	}
	_, code, ok := strings.Cut(section, "```go\n")
	code, _, ok2 := strings.Cut(code, "```")
	if !ok || !ok2 {
		t.Fatal("no ```go block in the Go section")
	}
	if n := strings.Count(code, "\n"); n >= 30 {
		t.Errorf("the documented worker has %d lines, not under 30", n)
	}
	self, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mod := "module docsexample\n\ngo 1.19\n\nrequire taskpush.dev/taskpush v0.0.0\n\n" +
		"replace taskpush.dev/taskpush => " + self + "\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "vet", ".")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go vet of the documented worker: %v\n%s", err, out)
	}
}
