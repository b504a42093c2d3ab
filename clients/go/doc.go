// Package taskpush is a worker and a producer client for the taskpush
// dispatcher (taskpushd), speaking the wire protocol of proto/PROTOCOL.md in
// version 3 (falling back to 2 and 1 for an older dispatcher). Standard
// library only.
//
// A Worker takes tasks of the types it registers (Handle) and runs each
// type's HandlerFunc on as many goroutines as its concurrency; Run(ctx)
// connects, reconnects over its addresses, and drains when ctx is cancelled.
// A Client submits tasks and returns once their rows are committed. The codec
// is the package taskpush.dev/taskpush/wire.
//
// docs/worker.md ("Go") has a complete worker and how to use the module from
// the repository.
package taskpush
