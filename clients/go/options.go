package taskpush

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"taskpush.dev/taskpush/wire"
)

// Options configures a Worker or a Client. The zero value of each field means
// its default.
type Options struct {
	// Name is shown by the dispatcher in /workers; default HOSTNAME:PID.
	Name string
	// Token is the dispatcher's shared secret (taskpushd --token-file).
	Token string
	// TLS, when set, speaks TLS to a taskpushd --tls-cert. Give it
	// Certificates for taskpushd --tls-ca (see TLSConfig).
	TLS *tls.Config
	// ReconnectMin and ReconnectMax bound the reconnect backoff (100 ms, 5 s):
	// each round of failed attempts doubles the ceiling, and a delay is drawn
	// between half the ceiling and the ceiling.
	ReconnectMin, ReconnectMax time.Duration
	// ConnectTimeout bounds the TCP connect, the TLS handshake and the
	// HELLO/WELCOME exchange (5 s).
	ConnectTimeout time.Duration
	// ProtocolVersion is the first HELLO's version (3); an older dispatcher
	// that refuses it is asked again one version lower.
	ProtocolVersion int
	// DrainTimeout bounds a graceful drain (Worker.Run after its context is
	// cancelled); past it the held tasks are cancelled as by Abort. 0: no bound.
	DrainTimeout time.Duration
	// Logf receives the library's diagnostics, from several goroutines (log.Printf
	// will do); nil keeps it silent.
	Logf func(format string, args ...interface{})
}

func (o *Options) withDefaults() (Options, error) {
	c := *o
	if c.Name == "" {
		host, _ := os.Hostname()
		c.Name = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if len(c.Name) > wire.MaxNameLen {
		c.Name = c.Name[:wire.MaxNameLen]
	}
	if len(c.Token) > wire.MaxTokenLen {
		return c, fmt.Errorf("taskpush: a token of %d bytes (at most %d)", len(c.Token), wire.MaxTokenLen)
	}
	if c.ReconnectMin <= 0 {
		c.ReconnectMin = 100 * time.Millisecond
	}
	if c.ReconnectMax <= 0 {
		c.ReconnectMax = 5 * time.Second
	}
	if c.ReconnectMax < c.ReconnectMin {
		c.ReconnectMax = c.ReconnectMin
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 5 * time.Second
	}
	if c.ProtocolVersion == 0 {
		c.ProtocolVersion = wire.Version
	}
	if c.ProtocolVersion < wire.VersionMin || c.ProtocolVersion > wire.Version {
		return c, fmt.Errorf("taskpush: protocol version %d (%d to %d)", c.ProtocolVersion, wire.VersionMin, wire.Version)
	}
	if c.Logf == nil {
		c.Logf = func(string, ...interface{}) {}
	}
	return c, nil
}

// TLSConfig builds a TLS configuration: caFile holds the PEM of the CAs that
// sign the dispatcher's certificate ("" for the system's); certFile and keyFile
// a client certificate for taskpushd --tls-ca ("" for none).
func TLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("taskpush: no certificate in %s", caFile)
		}
		cfg.RootCAs = pool
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// ParseAddresses splits "HOST:PORT[,HOST:PORT...]" (IPv6 as [::1]:7070).
func ParseAddresses(spec string) ([]string, error) {
	var out []string
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		host, port, err := net.SplitHostPort(item)
		if err != nil || host == "" {
			return nil, fmt.Errorf("taskpush: address %q is not HOST:PORT", item)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("taskpush: address %q: bad port", item)
		}
		out = append(out, net.JoinHostPort(host, port))
	}
	if len(out) == 0 {
		return nil, errors.New("taskpush: no address given")
	}
	return out, nil
}

// backoff gives exponential reconnect delays with jitter.
type backoff struct {
	min, max time.Duration
	failures uint
}

func (b *backoff) next() time.Duration {
	ceiling := b.max
	if b.failures < 30 && b.min<<b.failures < b.max {
		ceiling = b.min << b.failures
	}
	b.failures++
	half := ceiling / 2
	return half + time.Duration(rand.Int63n(int64(ceiling-half)+1))
}

func (b *backoff) reset() { b.failures = 0 }

// capAt keeps the next delay at most min * 2^n.
func (b *backoff) capAt(n uint) {
	if b.failures > n {
		b.failures = n
	}
}
