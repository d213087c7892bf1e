// Go's own time.ParseDuration and strconv.Atoi, and the poll interval Red Hat's controller derives from them
// (GetMetricsPollInterval in pkg/rhai/progression/progression.go at c0df7487865d6e2ab90b14982ec7ae69ead41d30,
// copied below with the annotation lookup replaced by the input text), used by tests/k8s/test_goparse.py to
// hold stepwatch's port (src/stepwatch/server/runners/kubernetes/goparse.py) to Go. Standard library only.
//
// Input: one JSON string a line. Output: one JSON object a line:
// {"duration": ns, "durationError": bool, "atoi": n, "atoiError": bool, "interval": ns}.
package main

import (
	"bufio"
	"encoding/json"
	"os"
	"strconv"
	"time"
)

type result struct {
	Duration      int64 `json:"duration"`
	DurationError bool  `json:"durationError"`
	Atoi          int   `json:"atoi"`
	AtoiError     bool  `json:"atoiError"`
	Interval      int64 `json:"interval"`
}

// pollInterval is GetMetricsPollInterval's body for an annotation holding intervalStr.
func pollInterval(intervalStr string) time.Duration {
	defaultInterval := time.Duration(30) * time.Second
	if intervalStr == "" {
		return defaultInterval
	}
	interval, err := time.ParseDuration(intervalStr)
	if err != nil {
		if seconds, parseErr := strconv.Atoi(intervalStr); parseErr == nil {
			interval = time.Duration(seconds) * time.Second
		} else {
			return defaultInterval
		}
	}
	if interval < 5*time.Second {
		return 5 * time.Second
	}
	if interval > 300*time.Second {
		return 300 * time.Second
	}
	return interval
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var text string
		if err := json.Unmarshal(in.Bytes(), &text); err != nil {
			panic(err)
		}
		var r result
		d, err := time.ParseDuration(text)
		r.Duration, r.DurationError = int64(d), err != nil
		n, err := strconv.Atoi(text)
		r.Atoi, r.AtoiError = n, err != nil
		r.Interval = int64(pollInterval(text))
		if err := out.Encode(r); err != nil {
			panic(err)
		}
	}
}
