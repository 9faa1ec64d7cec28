"""Runs redis-cli (-2 or -3) on a pseudo-terminal, answers linenoise's
cursor-position queries, types the given lines and reports how redis-cli
ended: HOST-less, PORT PROTO LINE... (a copy of test/e2e's driver, for the
relay's interactive test). Every wait is bounded."""
import os, pty, select, signal, struct, sys, time, fcntl, termios

port, proto, lines = sys.argv[1], sys.argv[2], sys.argv[3:]
signal.alarm(25)  # the whole script

pid, fd = pty.fork()
if pid == 0:
    try:
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    except OSError:
        pass
    os.environ["TERM"] = "xterm"
    os.execvp("redis-cli", ["redis-cli", "-" + proto, "-h", "127.0.0.1", "-p", port])

out = bytearray()

def pump(seconds, until=None):
    end = time.time() + seconds
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.05)
        if fd not in r:
            if until is not None and until in out:
                return True
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:
            return False
        if not data:
            return False
        out.extend(data)
        for _ in range(data.count(b"\x1b[6n")):
            os.write(fd, b"\x1b[1;1R")
    return until is None

status = None
try:
    prompt = ("127.0.0.1:%s> " % port).encode()
    pump(5, prompt)
    for line in lines:
        start = len(out)
        os.write(fd, line.encode() + b"\r")
        # Done when the output, past the echo of the line, ends with a
        # fresh prompt (or redis-cli is gone).
        end = time.time() + 5
        while time.time() < end:
            if not pump(0.1):
                break
            if len(out) > start + len(line) and b"\n" in out[start:] and out.endswith(prompt):
                pump(0.2)
                break
    pump(3)
    for _ in range(50):
        wpid, st = os.waitpid(pid, os.WNOHANG)
        if wpid == pid:
            status = st
            break
        time.sleep(0.1)
finally:
    if status is None:
        try:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        except OSError:
            pass

sys.stdout.write(out.decode("utf-8", "replace"))
if status is None:
    sys.stdout.write("\nREDIS-CLI UNKNOWN\n")
elif os.WIFSIGNALED(status):
    sys.stdout.write("\nREDIS-CLI SIGNAL %d\n" % os.WTERMSIG(status))
else:
    sys.stdout.write("\nREDIS-CLI EXIT %d\n" % os.WEXITSTATUS(status))
