// Command drainbench drains preloaded no-op tasks with K Go workers (one
// connection each, capacity C) in one process, as taskpush-bench's
// taskpush-ll design does with libtaskpush, and prints one JSON line. The
// clock runs from the workers' start until the handlers ran N times and
// taskpushd has written every outcome (its /stats: tasks.succeeded_total +
// failed_total = N, db.pending_writes = 0). bench/clients.sh runs it beside
// taskpush-bench.
//
//	drainbench --addr 127.0.0.1:7070 --admin 127.0.0.1:7071 --n 100000 --k 64
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"taskpush.dev/taskpush"
)

type stats struct {
	Tasks struct {
		Succeeded int64 `json:"succeeded_total"`
		Failed    int64 `json:"failed_total"`
	} `json:"tasks"`
	DB struct {
		PendingWrites int64 `json:"pending_writes"`
	} `json:"db"`
}

func fetch(admin string) (stats, error) {
	var s stats
	r, err := http.Get("http://" + admin + "/stats")
	if err != nil {
		return s, err
	}
	defer r.Body.Close()
	err = json.NewDecoder(r.Body).Decode(&s)
	return s, err
}

func main() {
	addr := flag.String("addr", "127.0.0.1:7070", "taskpushd --listen")
	admin := flag.String("admin", "127.0.0.1:7071", "taskpushd --admin")
	n := flag.Int64("n", 100000, "tasks preloaded")
	k := flag.Int("k", 64, "workers (connections)")
	capacity := flag.Int("capacity", 16, "capacity of each worker")
	taskType := flag.String("type", "default", "the task type")
	flag.Parse()

	var calls int64
	noop := func(context.Context, *taskpush.Task) ([]byte, error) {
		atomic.AddInt64(&calls, 1)
		return nil, nil
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	workers := make([]*taskpush.Worker, *k)
	for i := range workers {
		w, err := taskpush.NewWorker(*addr, taskpush.Options{Name: fmt.Sprintf("go-bench-%d", i)})
		if err == nil {
			err = w.Handle(*taskType, *capacity, noop)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "drainbench:", err)
			os.Exit(2)
		}
		workers[i] = w
	}
	start := time.Now()
	for _, w := range workers {
		wg.Add(1)
		go func(w *taskpush.Worker) {
			defer wg.Done()
			_ = w.Run(ctx)
		}(w)
	}
	progress, last := time.Now(), int64(0)
	for {
		c := atomic.LoadInt64(&calls)
		if c != last {
			last, progress = c, time.Now()
		}
		if c >= *n {
			s, err := fetch(*admin)
			if err == nil && s.Tasks.Succeeded+s.Tasks.Failed >= *n && s.DB.PendingWrites == 0 {
				break
			}
			time.Sleep(5 * time.Millisecond)
		} else {
			time.Sleep(2 * time.Millisecond)
		}
		if time.Since(progress) > 60*time.Second {
			fmt.Fprintf(os.Stderr, "drainbench: no progress for 60 s at %d of %d\n", c, *n)
			os.Exit(1)
		}
	}
	secs := time.Since(start).Seconds()
	stop()
	wg.Wait()
	out, _ := json.Marshal(map[string]interface{}{"client": "go", "k": *k, "capacity": *capacity, "n": *n,
		"handler_runs": atomic.LoadInt64(&calls), "seconds": secs, "tasks_per_s": float64(*n) / secs})
	fmt.Println(string(out))
}
