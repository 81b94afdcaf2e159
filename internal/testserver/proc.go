package testserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// ErrPortTaken reports that a server could not bind its port, or that
// another server answered on it: start it again on another port.
var ErrPortTaken = errors.New("port already in use")

// portAttempts is how often OnFreePort tries a fresh port.
const portAttempts = 5

// logTailLines is how many server log lines errors quote.
const logTailLines = 40

// Timeouts are how long a server may take to start (accept connections)
// and to stop before it is killed.
type Timeouts struct {
	Start, Stop time.Duration
}

// Proc is a server process in its own process group (see SysProcAttr),
// reaped by a goroutine of its own.
type Proc struct {
	kit, name, log string
	timeouts       Timeouts
	cmd            *exec.Cmd
	exited         chan struct{} // closed once the process has been reaped
	waitErr        error         // its exit status; read only after exited is closed
}

// Launch starts cmd, the server name (for errors, after kit) whose log is
// at log: with capture, cmd's output goes to the log, which a fresh start
// truncates and a restart appends to; without, the server writes its log
// itself and a fresh start only truncates it. Then it waits, up to the
// start timeout, until ready returns nil: ready returns ErrPortTaken when
// another server answered, and any other error while the server is not up
// yet. portTaken tells from the log's tail of a server that exited that it
// could not bind its port. On failure the process group is killed and
// reaped, and the error (ErrPortTaken, or one quoting the log's tail) is
// returned.
func Launch(kit, name, log string, timeouts Timeouts, cmd *exec.Cmd, fresh, capture bool,
	ready func(ctx context.Context) error, portTaken func(tail string) bool) (*Proc, error) {
	flags := os.O_CREATE | os.O_WRONLY | os.O_APPEND
	if fresh {
		flags |= os.O_TRUNC
	}
	logFile, err := os.OpenFile(log, flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", kit, err)
	}
	if capture {
		cmd.Stdout, cmd.Stderr = logFile, logFile
	}
	err = cmd.Start()
	logFile.Close() // the server has its own copy
	if err != nil {
		return nil, fmt.Errorf("%s: start %s: %w", kit, name, err)
	}
	p := &Proc{kit: kit, name: name, log: log, timeouts: timeouts, cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), timeouts.Start)
	defer cancel()
	if err := p.waitReady(ctx, ready, portTaken); err != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
		return nil, err
	}
	return p, nil
}

// waitReady polls ready every 20 ms until it returns nil or ErrPortTaken,
// the server exits, or ctx is done.
func (p *Proc) waitReady(ctx context.Context, ready func(ctx context.Context) error, portTaken func(tail string) bool) error {
	for {
		err := func() error {
			attempt, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			return ready(attempt)
		}()
		if err == nil || errors.Is(err, ErrPortTaken) {
			return err
		}
		select {
		case <-p.exited:
			tail := LogTail(p.log)
			if portTaken(tail) {
				return ErrPortTaken
			}
			return fmt.Errorf("%s: %s exited during startup (%v); log:\n%s", p.kit, p.name, p.waitErr, tail)
		case <-ctx.Done():
			return fmt.Errorf("%s: %s not ready after %v (%v); log:\n%s", p.kit, p.name, p.timeouts.Start, err, LogTail(p.log))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Halt sends sig to the server, if it is still running, and waits for it
// to exit, killing its whole process group after the stop timeout. A nil
// Proc has nothing to halt.
func (p *Proc) Halt(sig syscall.Signal) error {
	if p == nil {
		return nil
	}
	select {
	case <-p.exited:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: signal %s: %w", p.kit, p.name, err)
	}
	timer := time.NewTimer(p.timeouts.Stop)
	defer timer.Stop()
	select {
	case <-p.exited:
		return nil
	case <-timer.C:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // the server leads its own process group
	<-p.exited
	return fmt.Errorf("%s: %s did not shut down within %v, killed it; log:\n%s", p.kit, p.name, p.timeouts.Stop, LogTail(p.log))
}

// Pid is the server's process id, which is also its process group's.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// OnFreePort runs launch on a free loopback port, and again on another
// while it returns ErrPortTaken (the port was taken before the server
// bound it), a few times.
func OnFreePort(kit string, launch func(port int) error) error {
	var err error
	for range portAttempts {
		var port int
		if port, err = FreePort(kit); err != nil {
			return err
		}
		if err = launch(port); !errors.Is(err, ErrPortTaken) {
			return err
		}
	}
	return fmt.Errorf("%s: no free port after %d attempts: %w", kit, portAttempts, err)
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(kit string) (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("%s: find a free port: %w", kit, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// LogTail returns the last lines of the log at path.
func LogTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	const window = 64 << 10 // enough for logTailLines lines
	if fi, err := f.Stat(); err == nil && fi.Size() > window {
		_, _ = f.Seek(-window, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-logTailLines):], "\n")
}

// IsExecutable reports whether path is a regular file someone may execute.
func IsExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
