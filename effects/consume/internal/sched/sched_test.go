package sched

import (
	"slices"
	"testing"
)

func TestDropDone(t *testing.T) {
	for _, tc := range []struct {
		name string
		done []bool // per task, in queue order
		want []int  // the indexes that stay
	}{
		{"head run settled", []bool{true, true, false, false}, []int{2, 3}},
		{"all settled", []bool{true, true}, nil},
		{"nothing settled", []bool{false, false}, []int{0, 1}},
		{"head waits for its retry, the next settled", []bool{false, true, true, false}, []int{0, 3}},
		{"settled behind a waiting one", []bool{true, false, true, false}, []int{1, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := make([]*Task, len(tc.done))
			n := 0
			for i, d := range tc.done {
				q[i] = &Task{Attempt: i, done: d}
				if d {
					n++
				}
			}
			var got []int
			for _, u := range dropDone(q, n) {
				got = append(got, u.Attempt)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("left %v, want %v", got, tc.want)
			}
		})
	}
}
