// A stand-in for the OpenShift AI 3.4 controller's reading and writing of progression JSON, used by
// tests/test_progression_format.py to hold stepwatch.protocol.progression to Go's own encoding/json.
//
// The two structs have the field types, JSON names and omitempty options of TrainerStatus and
// AnnotationStatus in Red Hat's fork of Kubeflow Trainer (pkg/rhai/progression/progression.go at
// c0df7487865d6e2ab90b14982ec7ae69ead41d30); nothing else of that code is here. Standard library only.
//
// Input: one JSON object a line, {"kind": "status"|"annotation", "body": "<text>"}.
// Output: one JSON object a line, {"ok": bool, "error": "...", "annotation": "<json.Marshal of the result>"}.
// A status is written as an annotation with an empty summary and lastUpdatedTime "T".
package main

import (
	"bufio"
	"encoding/json"
	"os"
)

type trainerStatus struct {
	ProgressPercentage        *int                   `json:"progressPercentage"`
	EstimatedRemainingSeconds *int                   `json:"estimatedRemainingSeconds"`
	CurrentStep               *int                   `json:"currentStep"`
	TotalSteps                *int                   `json:"totalSteps"`
	CurrentEpoch              *float64               `json:"currentEpoch"`
	TotalEpochs               *int                   `json:"totalEpochs"`
	TrainMetrics              map[string]interface{} `json:"trainMetrics"`
	EvalMetrics               map[string]interface{} `json:"evalMetrics"`
}

type annotationStatus struct {
	ProgressPercentage            *int                   `json:"progressPercentage"`
	EstimatedRemainingSeconds     *int                   `json:"estimatedRemainingSeconds,omitempty"`
	EstimatedRemainingTimeSummary string                 `json:"estimatedRemainingTimeSummary,omitempty"`
	CurrentStep                   *int                   `json:"currentStep,omitempty"`
	TotalSteps                    *int                   `json:"totalSteps,omitempty"`
	CurrentEpoch                  *float64               `json:"currentEpoch,omitempty"`
	TotalEpochs                   *int                   `json:"totalEpochs,omitempty"`
	TrainMetrics                  map[string]interface{} `json:"trainMetrics,omitempty"`
	EvalMetrics                   map[string]interface{} `json:"evalMetrics,omitempty"`
	LastUpdatedTime               string                 `json:"lastUpdatedTime"`
}

type result struct {
	OK         bool   `json:"ok"`
	Error      string `json:"error,omitempty"`
	Annotation string `json:"annotation,omitempty"`
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var c struct {
			Kind string `json:"kind"`
			Body string `json:"body"`
		}
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			panic(err)
		}
		var a annotationStatus
		var err error
		if c.Kind == "status" {
			var s trainerStatus
			if err = json.Unmarshal([]byte(c.Body), &s); err == nil {
				a = annotationStatus{s.ProgressPercentage, s.EstimatedRemainingSeconds, "", s.CurrentStep,
					s.TotalSteps, s.CurrentEpoch, s.TotalEpochs, s.TrainMetrics, s.EvalMetrics, "T"}
			}
		} else {
			err = json.Unmarshal([]byte(c.Body), &a)
		}
		if err != nil {
			_ = out.Encode(result{Error: err.Error()})
			continue
		}
		b, merr := json.Marshal(a)
		if merr != nil {
			_ = out.Encode(result{Error: "marshal: " + merr.Error()})
			continue
		}
		_ = out.Encode(result{OK: true, Annotation: string(b)})
	}
}
