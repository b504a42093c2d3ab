// Command worker is a complete taskpush worker in Go: it runs "resize" tasks
// with 8 goroutines and stops gracefully on SIGTERM or SIGINT (a second
// signal stops at once).
//
//	go run ./examples/worker 127.0.0.1:7070
package main

import (
	"context"
	"errors"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"taskpush.dev/taskpush"
)

func resize(ctx context.Context, t *taskpush.Task) ([]byte, error) {
	if len(t.Payload) == 0 {
		return nil, taskpush.Permanent(errors.New("empty payload")) // FAILED, never retried
	}
	select {
	case <-time.After(10 * time.Millisecond): // the work
	case <-ctx.Done(): // CANCEL from the dispatcher
		return nil, ctx.Err()
	}
	return []byte(`{"ok":true}`), nil
}

func main() {
	addrs := "127.0.0.1:7070"
	if len(os.Args) > 1 {
		addrs = os.Args[1]
	}
	w, err := taskpush.NewWorker(addrs, taskpush.Options{Token: os.Getenv("TASKPUSH_TOKEN"), Logf: log.Printf})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Handle("resize", 8, resize); err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the process (Go's default action)
	}()
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
