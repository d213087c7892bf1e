// Go's own time.ParseDuration and strconv.Atoi, used by tests/k8s/test_goparse.py to hold stepwatch's port
// (src/stepwatch/server/runners/kubernetes/goparse.py), on which the poll interval of OpenShift AI's
// controller rests (trainer.opendatahub.io/metrics-poll-interval), to Go. Standard library only.
//
// Input: one JSON string a line. Output: one JSON object a line:
// {"duration": ns, "durationError": bool, "atoi": n, "atoiError": bool}.
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
		if err := out.Encode(r); err != nil {
			panic(err)
		}
	}
}
