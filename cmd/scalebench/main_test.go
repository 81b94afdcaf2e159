package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"effectively.dev/effects"
	"effectively.dev/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestQuick runs every experiment in -quick mode and checks that each
// table is there, complete and sane: every case and mode has its row,
// rates are positive, p99 is no less than p50, the B-tree of the larger
// fill is no shallower, the pruning modes pruned, the cycles' tables took
// keys and lost them to the Pruner.
func TestQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a durable PostgreSQL cluster and fills tables")
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"-quick"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, &out, &errb)
	}
	report := out.String()
	t.Log(report)

	applySection := section(t, report, "## Apply")
	apply := rows(t, applySection, 14)
	wantApply := 2 * (2*len(variants) + len(variants)) // two shapes; the small fill with its control, the large without
	if len(apply) != wantApply {
		t.Fatalf("%d apply rows, want %d:\n%s", len(apply), wantApply, report)
	}
	for _, r := range apply {
		rate, p50, p99, wal, hits := num(t, r[3]), num(t, r[5]), num(t, r[6]), num(t, r[8]), num(t, r[11])
		if rate <= 0 || p50 <= 0 || p99 < p50 || wal <= 0 || hits <= 0 {
			t.Errorf("apply row %q: keys/s %v, p50 %v, p99 %v, WAL %v, blocks hit %v: want positive rates, WAL and hits, p99 >= p50", r, rate, p50, p99, wal, hits)
		}
	}
	trees := rows(t, applySection, 5)
	if len(trees) != 4 {
		t.Fatalf("%d B-tree rows, want 4:\n%s", len(trees), applySection)
	}
	for _, shape := range shapes {
		var levels []float64
		for _, r := range trees {
			if r[1] == shape {
				levels = append(levels, num(t, r[2]))
				if fill := num(t, r[4]); fill <= 0 || fill > 100 {
					t.Errorf("B-tree row %q: leaf fill %v%%", r, fill)
				}
			}
		}
		if len(levels) != 2 || levels[1] < levels[0] || levels[0] < 1 {
			t.Errorf("%s B-tree levels %v, want two fills, the larger no shallower", shape, levels)
		}
	}

	prune := section(t, report, "## Pruning")
	modes := rows(t, prune[:strings.Index(prune, "Drain:")], 10)
	if len(modes) != len(pruneModes) {
		t.Fatalf("%d prune mode rows, want %d:\n%s", len(modes), len(pruneModes), prune)
	}
	for _, r := range modes {
		applied, pruned := num(t, r[1]), num(t, r[6])
		if applied <= 0 {
			t.Errorf("mode %s applied nothing: %q", r[0], r)
		}
		switch mode := r[0]; mode {
		case modeNone, modeControl:
			if pruned != 0 {
				t.Errorf("mode %s pruned %v keys/s, want 0", mode, pruned)
			}
		case modePruner, modeLoop:
			// Every round's window has expired keys to prune, also those
			// after an unpaced loop emptied the backlog: the range's low
			// end is positive.
			if low := rangeLow(t, r[6]); pruned <= 0 || low <= 0 {
				t.Errorf("mode %s pruned nothing in some window (median %v, lowest %v): %q", mode, pruned, low, r)
			}
		default:
			t.Errorf("unknown mode row %q", r)
		}
	}
	drains := rows(t, prune[strings.Index(prune, "Drain:"):], 10)
	if len(drains) != 2 {
		t.Fatalf("%d drain rows, want 2:\n%s", len(drains), prune)
	}
	for _, r := range drains {
		if num(t, r[2]) <= 0 || num(t, r[6]) <= 0 {
			t.Errorf("drain row %q: want a positive prune rate and size", r)
		}
	}

	cycles := section(t, report, "## Steady state")
	final := rows(t, cycles[strings.Index(cycles, "| autovacuum | shape | inserted"):], 13)
	if len(final) != 4 {
		t.Fatalf("%d cycle tables, want 4:\n%s", len(final), cycles)
	}
	for _, r := range final {
		if num(t, r[2]) <= 0 || num(t, r[3]) <= 0 || num(t, r[11]) <= 0 {
			t.Errorf("cycles row %q: want keys inserted and pruned, and a size", r)
		}
	}
}

// section returns report from the line starting with heading to the
// next heading.
func section(t *testing.T, report, heading string) string {
	t.Helper()
	i := strings.Index(report, "\n"+heading)
	if i < 0 {
		t.Fatalf("no %q section:\n%s", heading, report)
	}
	s := report[i+1:]
	if j := strings.Index(s[1:], "\n## "); j >= 0 {
		s = s[:j+1]
	}
	return s
}

// rows returns the cells of the data rows (those after a table's
// separator line) of the markdown tables in s that have n columns.
func rows(t *testing.T, s string, n int) [][]string {
	t.Helper()
	var out [][]string
	data := false
	for _, line := range strings.Split(s, "\n") {
		switch {
		case strings.HasPrefix(line, "|---"):
			data = true
		case !strings.HasPrefix(line, "| "):
			data = false
		case data:
			if cells := strings.Split(strings.Trim(line, "| "), " | "); len(cells) == n {
				out = append(out, cells)
			}
		}
	}
	return out
}

var leadingNumber = regexp.MustCompile(`^-?[0-9.]+`)

var rangeCell = regexp.MustCompile(`\(([0-9.]+)–[0-9.]+\)`)

// rangeLow parses the low end of a cell's range ("1234 (1000–1500)" is 1000).
func rangeLow(t *testing.T, cell string) float64 {
	t.Helper()
	m := rangeCell.FindStringSubmatch(cell)
	if m == nil {
		t.Fatalf("cell %q has no (low–high) range", cell)
	}
	f, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatalf("cell %q: %v", cell, err)
	}
	return f
}

// num parses the number a cell starts with ("1234 (1000–1500)" is 1234).
func num(t *testing.T, cell string) float64 {
	t.Helper()
	m := leadingNumber.FindString(cell)
	f, err := strconv.ParseFloat(m, 64)
	if err != nil {
		t.Fatalf("cell %q does not start with a number", cell)
	}
	return f
}

// TestIDs: both shapes are UUIDs of their version; time-ordered ids made
// at later milliseconds sort later.
func TestIDs(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-([47])[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	base := time.UnixMilli(1_700_000_000_000)
	var ordered []string
	for i := range 100 {
		for _, shape := range shapes {
			id := newID(shape, base.Add(time.Duration(i)*time.Millisecond), r)
			m := uuid.FindStringSubmatch(id)
			want := map[string]string{shapeRandom: "4", shapeTimeOrdered: "7"}[shape]
			if m == nil || m[1] != want {
				t.Fatalf("%s id %q is not a version %s UUID", shape, id, want)
			}
			if shape == shapeTimeOrdered {
				ordered = append(ordered, id)
			}
		}
	}
	if !slices.IsSorted(ordered) {
		t.Errorf("uuid7 ids made at increasing times do not sort in that order: %v", ordered)
	}
}

// TestFillKeysAreNewKeys: the keys a fill writes in SQL are those
// effects.NewKey builds, and a time-ordered one carries the same
// milliseconds as newID.
func TestFillKeysAreNewKeys(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.DB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	at := time.UnixMilli(1_700_000_000_123)
	for _, shape := range shapes {
		var key string
		sql := fmt.Sprintf(`SELECT %s`, keySQL(idSQL(shape, strconv.FormatInt(at.UnixMilli(), 10)+"::bigint")))
		if err := conn.QueryRow(ctx, sql, scope).Scan(&key); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		parts := strings.Split(key, ":")
		if len(parts) != 3 {
			t.Fatalf("%s key %q: not scope:id:step", shape, key)
		}
		want, err := effects.NewKey(scope, parts[1], step)
		if err != nil || string(want) != key {
			t.Errorf("%s key %q, NewKey gives %q (%v)", shape, key, want, err)
		}
		goID := newID(shape, at, rand.New(rand.NewPCG(3, 4)))
		if len(parts[1]) != len(goID) || parts[1][14] != goID[14] {
			t.Errorf("%s: SQL id %q and Go id %q differ in length or version", shape, parts[1], goID)
		}
		if shape == shapeTimeOrdered && parts[1][:13] != goID[:13] {
			t.Errorf("SQL id %q and Go id %q, made at the same millisecond, differ in their time bits", parts[1], goID)
		}
	}
}

func TestRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-experiments", "apply,nope"}, {"-fills", "1e4,x"}, {"-fills", "0"},
		{"-shapes", "uuid5"}, {"-rounds", "0"}, {"-naptime", "10ms"}, {"-settings", "novalue"}, {"-memlimit", "lots"}, {"extra"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != 2 || errb.Len() == 0 {
			t.Errorf("run(%q) = %d (stderr %q), want 2 and a message", args, code, &errb)
		}
	}
}

func TestCounts(t *testing.T) {
	var errs []error
	if got := counts("1e4,1e6,2500000", "-fills", &errs); !slices.Equal(got, []int64{10000, 1000000, 2500000}) || len(errs) > 0 {
		t.Errorf("counts = %v, %v", got, errs)
	}
	for _, n := range []int64{1000, 20000, 10000000, 2500000} {
		if got := counts(si(n), "-fills", &errs); len(got) != 1 || got[0] != n || len(errs) > 0 {
			t.Errorf("si(%d) = %q does not parse back: %v %v", n, si(n), got, errs)
		}
	}
}

func TestQuantile(t *testing.T) {
	var xs []time.Duration
	for i := 1; i <= 100; i++ {
		xs = append(xs, time.Duration(i))
	}
	if p50, p99, p100 := quantile(xs, 0.5), quantile(xs, 0.99), quantile(xs, 1); p50 != 50 || p99 != 99 || p100 != 100 {
		t.Errorf("p50 %d p99 %d p100 %d, want 50 99 100", p50, p99, p100)
	}
	if quantile(nil, 0.5) != 0 || quantile(xs[:1], 0.99) != 1 {
		t.Error("quantile of 0 or 1 values")
	}
}
