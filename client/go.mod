module stockd.dev/stockd/client

// 1.22: loop variables are per iteration, which the code relies on.
go 1.22
