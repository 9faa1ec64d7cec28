// Package harness provides test helpers for lockproxy's integration tests:
// real redis-server child processes on free loopback ports, generic child
// processes (the lockproxy binary, redis-cli, python, node, ...), and a
// once-per-run build of ./cmd/lockproxy.
//
// Process hygiene rules followed throughout (PID 1 on the test machines does
// not reap orphans, and other programs may own well-known ports):
//
//   - every child is started in its own process group (Setpgid) and is
//     reaped exactly once: a single goroutine calls cmd.Wait and then closes
//     a done channel; everything else (Kill, Stop, Restart, Wait, cleanup)
//     only waits on that channel, always with a timeout;
//   - the test process makes itself child subreaper (PR_SET_CHILD_SUBREAPER),
//     so group members orphaned when their parent dies are reparented to it;
//     after a child is killed and reaped, the rest of its process group is
//     reaped too (wait4 on -PGID), so no zombies are left behind;
//   - processes are only ever signalled by PID (or by -PID for their own
//     process group), never by name;
//   - every child is killed and reaped in a t.Cleanup registered when it is
//     started;
//   - only 127.0.0.1 is used, and ports always come from FreePort, which
//     never hands out the same port twice in one test binary and never
//     returns 6379 or 7001-7005.
package harness
