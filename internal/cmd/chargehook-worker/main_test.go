package main

import (
	"bytes"
	"strings"
	"testing"
)

// The usage text never shows DATABASE_URL's password: the environment is
// read after the flags are parsed, not as a flag's default.
func TestUsageDoesNotPrintDatabaseURL(t *testing.T) {
	const secret = "hunter2-not-for-logs"
	t.Setenv("DATABASE_URL", "postgres://worker:"+secret+"@127.0.0.1:1/db")
	for name, run := range map[string]func([]string, *bytes.Buffer) int{
		"consumer": func(args []string, stderr *bytes.Buffer) int { return run(args, &bytes.Buffer{}, stderr) },
		"share":    func(args []string, stderr *bytes.Buffer) int { return runShare(args, &bytes.Buffer{}, stderr) },
	} {
		for _, args := range [][]string{{"-h"}, {"-topic", "t"}} {
			var stderr bytes.Buffer
			if code := run(args, &stderr); code != 2 {
				t.Errorf("%s %v: exit %d, want 2", name, args, code)
			}
			if !strings.Contains(stderr.String(), "-database-url") {
				t.Errorf("%s %v: no usage text:\n%s", name, args, stderr.String())
			}
			if strings.Contains(stderr.String(), secret) {
				t.Errorf("%s %v: the usage text shows DATABASE_URL's password:\n%s", name, args, stderr.String())
			}
		}
	}
}

// -database-url defaults to DATABASE_URL once the flags are parsed: it
// is not reported missing.
func TestDatabaseURLFromEnvironment(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://worker:pw@127.0.0.1:1/db")
	t.Setenv("KAFKA_BROKERS", "")
	cfg := config{topic: "t", output: "o", group: "g"}
	cfg.fromEnv()
	if got := strings.Join(cfg.missingFlags(), ","); got != "-brokers" {
		t.Errorf("missing %q, want only -brokers", got)
	}
}
