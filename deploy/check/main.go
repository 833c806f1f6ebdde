// Command check reads Kubernetes manifests (the output of `helm template`,
// documents separated by `---`) on standard input and checks each one
// offline against Kubernetes' own API types: it is decoded strictly into
// the Go type its apiVersion and kind name, from k8s.io/api (and, for
// ServiceMonitor, the prometheus-operator's types), so an unknown or
// misspelt field, a duplicate field, a value of the wrong type or a kind
// the API does not have is an error. Then it applies the apiserver's own
// rules for names (from k8s.io/apimachinery's validation package) to what
// a chart computes: object, label, port, volume and environment variable
// names, and that every volume mount names a volume of its pod.
//
// It prints one line per valid document (with -json, the decoded objects
// as one JSON array, for a test to read what was rendered without a YAML
// parser) and exits 1, naming each problem, when any document fails.
//
//	helm template deploy/helm/posbridge | check [-json]
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
)

func main() {
	asJSON := flag.Bool("json", false, "print the decoded objects as a JSON array instead of a line each")
	flag.Parse()
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "check: reading standard input: %v\n", err)
		os.Exit(2)
	}
	valid, problems := checkAll(input)
	for _, problem := range problems {
		fmt.Fprintln(os.Stderr, problem)
	}
	if len(valid) == 0 && len(problems) == 0 {
		fmt.Fprintln(os.Stderr, "check: no manifest on standard input")
		os.Exit(1)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
	if *asJSON {
		objects := make([]runtime.Object, 0, len(valid))
		for _, v := range valid {
			objects = append(objects, v.object)
		}
		if err := json.NewEncoder(os.Stdout).Encode(objects); err != nil {
			fmt.Fprintf(os.Stderr, "check: writing JSON: %v\n", err)
			os.Exit(2)
		}
		return
	}
	for _, v := range valid {
		fmt.Println(v.line)
	}
}

// checked is one valid document: its summary line and the decoded object.
type checked struct {
	line   string
	object runtime.Object
}

// newDecoder knows the API groups a chart of ours renders; a kind outside
// them is reported as unknown rather than passed unchecked.
func newDecoder() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme,
		appsv1.AddToScheme,
		policyv1.AddToScheme,
		monitoringv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			panic(err) // only a broken build of the API packages gets here
		}
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}

// checkAll returns the valid documents and a line per problem.
func checkAll(input []byte) (valid []checked, problems []string) {
	decoder := newDecoder()
	for i, doc := range splitDocuments(input) {
		obj, gvk, err := decoder.Decode(doc.text, nil, nil)
		where := fmt.Sprintf("document %d (%s)", i+1, doc.source)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", where, err))
			continue
		}
		meta, ok := obj.(metav1.Object)
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: %s has no object metadata", where, gvk.Kind))
			continue
		}
		what := fmt.Sprintf("%s %s", gvk.Kind, meta.GetName())
		found := namingProblems(obj, meta)
		for _, p := range found {
			problems = append(problems, fmt.Sprintf("%s: %s: %s", where, what, p))
		}
		if len(found) == 0 {
			line := fmt.Sprintf("valid: %s %s %s", gvk.GroupVersion(), gvk.Kind, meta.GetName())
			valid = append(valid, checked{line: line, object: obj})
		}
	}
	return valid, problems
}

type document struct {
	text   []byte
	source string // helm's "# Source: chart/templates/x.yaml" line, if any
}

// splitDocuments cuts a YAML stream at its `---` lines, dropping documents
// that hold only comments or blanks (helm leaves those for templates that
// render nothing).
func splitDocuments(input []byte) []document {
	var docs []document
	var current bytes.Buffer
	source := "no source line"
	flush := func() {
		content := false
		for _, line := range strings.Split(current.String(), "\n") {
			trimmed := strings.TrimSpace(line)
			if trimmed != "" && !strings.HasPrefix(trimmed, "#") {
				content = true
				break
			}
		}
		if content {
			docs = append(docs, document{text: append([]byte(nil), current.Bytes()...), source: source})
		}
		current.Reset()
		source = "no source line"
	}
	scanner := bufio.NewScanner(bytes.NewReader(input))
	scanner.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for scanner.Scan() {
		line := scanner.Text()
		if line == "---" || strings.HasPrefix(line, "--- ") {
			flush()
			continue
		}
		if s, ok := strings.CutPrefix(line, "# Source: "); ok {
			source = s
		}
		current.WriteString(line)
		current.WriteByte('\n')
	}
	flush()
	return docs
}
