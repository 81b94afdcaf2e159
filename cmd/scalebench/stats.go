package main

import (
	"fmt"
	"slices"
	"time"
)

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func minMax(xs []float64) (float64, float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	return slices.Min(xs), slices.Max(xs)
}

// quantile returns the q-quantile (0 < q ≤ 1) of sorted, nearest rank.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// ms formats a duration in milliseconds.
func ms(d float64) string { return fmt.Sprintf("%.2f", d/float64(time.Millisecond)) }

// spread formats a median and range as "median (lo–hi)" with format f.
func spread(xs []float64, f func(float64) string) string {
	lo, hi := minMax(xs)
	return fmt.Sprintf("%s (%s–%s)", f(median(xs)), f(lo), f(hi))
}

// spreadRatio formats ratios as "median× (lo–hi)".
func spreadRatio(xs []float64) string {
	lo, hi := minMax(xs)
	return fmt.Sprintf("%.2f× (%.2f–%.2f)", median(xs), lo, hi)
}

func count(x float64) string { return fmt.Sprintf("%.0f", x) }

// mib formats bytes in MiB.
func mib(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }

// si formats n like 1e4, 1e6, 2.5e6.
func si(n int64) string {
	if n <= 0 {
		return "0"
	}
	e := 0
	m := float64(n)
	for m >= 10 {
		m /= 10
		e++
	}
	if e < 3 {
		return fmt.Sprint(n)
	}
	return fmt.Sprintf("%ge%d", m, e)
}
