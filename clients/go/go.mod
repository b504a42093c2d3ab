module taskpush.dev/taskpush

go 1.19
