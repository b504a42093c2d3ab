package taskpush_test

// Fixtures of the integration tests: a database of its own on the test
// MariaDB (scripts/tp-mariadb's TASKPUSH_TEST_MYSQL_* environment; SQL runs
// through the mariadb command-line client, the module needs no driver), the
// build tree's real taskpushd (TASKPUSH_BUILD_ROOT), and test certificates.
//
// Run from the meson test list (tests/conformance/meson.build) every
// integration test runs: a missing database fails them. A bare `go test`
// outside the build (no TASKPUSH_BUILD_ROOT) skips them.

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const waitBound = 30 * time.Second // every wait's bound; nothing asserts a duration

var daemonFlags = []string{"--heartbeat-ms", "200", "--retry-backoff-ms", "50", "--retry-backoff-max-ms", "200",
	"--poll-ms", "20", "--shutdown-grace-ms", "3000", "--orphan-grace-ms", "200"}

func sourceRoot() string {
	if r := os.Getenv("TASKPUSH_SOURCE_ROOT"); r != "" {
		return r
	}
	return filepath.Join("..", "..")
}

// needIntegration returns the build root, or skips outside the build.
func needIntegration(t *testing.T) string {
	t.Helper()
	b := os.Getenv("TASKPUSH_BUILD_ROOT")
	if b == "" {
		t.Skip("TASKPUSH_BUILD_ROOT is not set: run through meson test (tests/conformance)")
	}
	return b
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(waitBound)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s", waitBound, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type testDB struct {
	t                          *testing.T
	host, port, user, password string
	client                     string
	name                       string
	url                        string
}

var dbSerial struct {
	sync.Mutex
	n int
}

func newDB(t *testing.T) *testDB {
	t.Helper()
	d := &testDB{t: t, host: os.Getenv("TASKPUSH_TEST_MYSQL_HOST"), port: os.Getenv("TASKPUSH_TEST_MYSQL_PORT"),
		user: os.Getenv("TASKPUSH_TEST_MYSQL_USER"), password: os.Getenv("TASKPUSH_TEST_MYSQL_PASSWORD")}
	if d.host == "" || d.port == "" || d.user == "" {
		t.Fatal("TASKPUSH_TEST_MYSQL_HOST/PORT/USER are not set. Start a test server first:\n" +
			"    eval \"$(scripts/tp-mariadb start /tmp/tpdb)\"")
	}
	for _, c := range []string{"mariadb", "mysql"} {
		if p, err := exec.LookPath(c); err == nil {
			d.client = p
			break
		}
	}
	if d.client == "" {
		t.Fatal("no mariadb client (scripts/install-deps.sh installs mariadb-client-core)")
	}
	dbSerial.Lock()
	dbSerial.n++
	n := dbSerial.n
	dbSerial.Unlock()
	tag := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, t.Name())
	if len(tag) > 24 {
		tag = tag[:24]
	}
	d.name = fmt.Sprintf("tp_go_%s_%d_%d", tag, os.Getpid(), n)
	d.run("", fmt.Sprintf("DROP DATABASE IF EXISTS `%s`; CREATE DATABASE `%s` CHARACTER SET utf8mb4", d.name, d.name))
	schema, err := os.ReadFile(filepath.Join(sourceRoot(), "sql", "schema.sql"))
	if err != nil {
		t.Fatal(err)
	}
	d.run(d.name, string(schema))
	pw := ""
	if d.password != "" {
		pw = ":" + d.password
	}
	d.url = fmt.Sprintf("mysql://%s%s@%s:%s/%s", d.user, pw, d.host, d.port, d.name)
	t.Cleanup(func() {
		if os.Getenv("TASKPUSH_TEST_KEEP_DB") == "" {
			d.run("", fmt.Sprintf("DROP DATABASE IF EXISTS `%s`", d.name))
		}
	})
	return d
}

func (d *testDB) run(db, sql string) string {
	d.t.Helper()
	args := []string{"--no-defaults", "--protocol=tcp", "-h", d.host, "-P", d.port, "-u", d.user,
		"--batch", "--skip-column-names", "--raw", "--default-character-set=utf8mb4"}
	if d.password != "" {
		args = append(args, "-p"+d.password)
	}
	if db != "" {
		args = append(args, db)
	}
	cmd := exec.Command(d.client, args...)
	cmd.Stdin = strings.NewReader(sql)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		d.t.Fatalf("SQL failed: %.300s\n%s", sql, errb.String())
	}
	return out.String()
}

func (d *testDB) exec(sql string) { d.t.Helper(); d.run(d.name, sql) }

func (d *testDB) rows(sql string) [][]string {
	d.t.Helper()
	var out [][]string
	for _, line := range strings.Split(strings.TrimRight(d.run(d.name, sql), "\n"), "\n") {
		if line != "" {
			out = append(out, strings.Split(line, "\t"))
		}
	}
	return out
}

func (d *testDB) count(where string) int {
	d.t.Helper()
	r := d.rows("SELECT COUNT(*) FROM task WHERE " + where)
	n, _ := strconv.Atoi(r[0][0])
	return n
}

// insert adds one NEW row per payload (text payloads).
func (d *testDB) insert(taskType string, payloads ...string) {
	d.t.Helper()
	vals := make([]string, len(payloads))
	for i, p := range payloads {
		vals[i] = fmt.Sprintf("('%s', '%s')", taskType, strings.ReplaceAll(p, "'", "''"))
	}
	d.exec("INSERT INTO task (task_type, payload) VALUES " + strings.Join(vals, ","))
}

func (d *testDB) waitRows(t *testing.T, where string, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d rows where %s", n, where), func() bool { return d.count(where) >= n })
}

// daemon is the build tree's taskpushd on loopback ports.
type daemon struct {
	t         *testing.T
	db        *testDB
	extra     []string
	cmd       *exec.Cmd
	readyPath string
	logPath   string
	listen    string
	admin     string
	adminTLS  *http.Client
}

var daemonSerial struct {
	sync.Mutex
	n int
}

func startDaemon(t *testing.T, db *testDB, listen string, lead bool, extra ...string) *daemon {
	t.Helper()
	return startDaemonWith(t, db, listen, lead, nil, extra...)
}

// startDaemonWith: adminCA, when set, is the TLS configuration for the admin
// port, which speaks https under --tls-cert.
func startDaemonWith(t *testing.T, db *testDB, listen string, lead bool, adminCA *tls.Config,
	extra ...string) *daemon {
	t.Helper()
	daemonSerial.Lock()
	daemonSerial.n++
	n := daemonSerial.n
	daemonSerial.Unlock()
	dir := t.TempDir()
	d := &daemon{t: t, db: db, extra: extra, readyPath: filepath.Join(dir, fmt.Sprintf("ready-%d", n)),
		logPath: filepath.Join(dir, fmt.Sprintf("taskpushd-%d.log", n))}
	if adminCA != nil {
		d.adminTLS = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: adminCA}}
	}
	d.start(listen, lead)
	t.Cleanup(func() {
		d.kill()
		if t.Failed() {
			b, _ := os.ReadFile(d.logPath)
			lines := strings.Split(string(b), "\n")
			if len(lines) > 60 {
				lines = lines[len(lines)-60:]
			}
			t.Logf("---- %s ----\n%s", d.logPath, strings.Join(lines, "\n"))
		}
	})
	return d
}

func (d *daemon) start(listen string, lead bool) {
	t := d.t
	t.Helper()
	os.Remove(d.readyPath)
	exe := filepath.Join(os.Getenv("TASKPUSH_BUILD_ROOT"), "dispatcher", "taskpushd")
	args := append([]string{"--db", d.db.url, "--listen", listen, "--admin", "127.0.0.1:0",
		"--ready-file", d.readyPath}, daemonFlags...)
	args = append(args, d.extra...)
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	d.cmd = exec.Command(exe, args...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func(c *exec.Cmd) { _ = c.Wait(); close(exited) }(d.cmd)
	end := time.Now().Add(waitBound)
	for {
		var ready struct{ Listen, Admin string }
		if b, err := os.ReadFile(d.readyPath); err == nil && json.Unmarshal(b, &ready) == nil && ready.Listen != "" {
			d.listen, d.admin = ready.Listen, ready.Admin
			break
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(d.logPath)
			t.Fatalf("taskpushd exited early:\n%s", b)
		default:
		}
		if time.Now().After(end) {
			t.Fatal("taskpushd wrote no ready file")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if lead {
		// The ready file comes before leadership: a SUBMIT before it is UNAVAILABLE.
		waitFor(t, "taskpushd to lead", func() bool {
			v, err := d.stats()
			return err == nil && v["leader"] == true
		})
	}
}

func (d *daemon) httpClient() *http.Client {
	if d.adminTLS != nil {
		return d.adminTLS
	}
	return &http.Client{Timeout: 10 * time.Second}
}

func (d *daemon) url(path string) string {
	scheme := "http"
	if d.adminTLS != nil {
		scheme = "https"
	}
	return scheme + "://" + d.admin + path
}

func (d *daemon) stats() (map[string]interface{}, error) {
	r, err := d.httpClient().Get(d.url("/stats"))
	if err != nil {
		return nil, err
	}
	defer r.Body.Close()
	var v map[string]interface{}
	err = json.NewDecoder(r.Body).Decode(&v)
	return v, err
}

func (d *daemon) post(path string) string {
	d.t.Helper()
	req, _ := http.NewRequest("POST", d.url(path), nil)
	req.Header.Set("X-Taskpush-Admin", "1")
	r, err := d.httpClient().Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return string(b)
}

func (d *daemon) signal(sig syscall.Signal) {
	if d.cmd != nil && d.cmd.Process != nil {
		_ = d.cmd.Process.Signal(sig)
	}
}

// kill ends the process with SIGKILL and waits until its port is free.
func (d *daemon) kill() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGCONT)
	_ = d.cmd.Process.Kill()
	end := time.Now().Add(waitBound)
	for time.Now().Before(end) {
		if err := d.cmd.Process.Signal(syscall.Signal(0)); err != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.cmd = nil
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// makeCerts writes a CA, a server certificate for 127.0.0.1 and a client
// certificate signed by the CA, with the openssl command (as test_tls.c).
func makeCerts(t *testing.T) string {
	dir := t.TempDir()
	key := "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
	caExt := "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
	steps := []string{
		`printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > server.ext`,
		`printf 'extendedKeyUsage=clientAuth\n' > client.ext`,
		"openssl req -x509 " + key + " -keyout ca.key -out ca.pem -days 2 -subj /CN=taskpush-go-ca " + caExt,
		"openssl req " + key + " -keyout server.key -out server.csr -subj /CN=taskpushd-go",
		"openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext -out server.pem",
		"openssl req " + key + " -keyout client.key -out client.csr -subj /CN=go-worker",
		"openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile client.ext -out client.pem",
	}
	for _, s := range steps {
		cmd := exec.Command("sh", "-c", s)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("making certificates failed at %s:\n%s", s, out)
		}
	}
	return dir
}

func writeFile(path, text string) error { return os.WriteFile(path, []byte(text), 0o600) }
