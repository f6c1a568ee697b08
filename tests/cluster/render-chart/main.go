// Command render-chart renders a Helm chart as `helm template` would, with
// Helm's own Go library, so that the cluster tests apply exactly what the
// chart ships: every manifest for a release name and namespace, the chart's
// values overlaid with values files and JSON values, for a given Kubernetes
// version, printed as one YAML stream (NOTES.txt left out).
//
// With -kubeconfig it instead does what `helm upgrade --install --wait` does
// against that cluster (cmd/helm/upgrade.go in helm/helm: install when the
// release has no history, else upgrade; then Helm's own wait for every
// object the release made ready, up to -timeout), logs Helm's progress on
// standard error and prints the release's name, revision and status.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// repeated collects a flag given several times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

// set puts value at the dotted path key of values, making maps on the way.
func set(values map[string]interface{}, key string, value interface{}) error {
	parts := strings.Split(key, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := values[p].(map[string]interface{})
		if !ok {
			if _, present := values[p]; present {
				return fmt.Errorf("--set-json %s: %s is not a map", key, p)
			}
			next = map[string]interface{}{}
			values[p] = next
		}
		values = next
	}
	values[parts[len(parts)-1]] = value
	return nil
}

func userValues(files, sets []string) (map[string]interface{}, error) {
	values := map[string]interface{}{}
	for _, file := range files {
		read, err := chartutil.ReadValuesFile(file)
		if err != nil {
			return nil, fmt.Errorf("--values %s: %w", file, err)
		}
		values = chartutil.CoalesceTables(read.AsMap(), values)
	}
	for _, s := range sets {
		key, text, ok := strings.Cut(s, "=")
		if !ok {
			return nil, fmt.Errorf("--set-json %q: not KEY=JSON", s)
		}
		var value interface{}
		if err := json.Unmarshal([]byte(text), &value); err != nil {
			return nil, fmt.Errorf("--set-json %s: %w", key, err)
		}
		if err := set(values, key, value); err != nil {
			return nil, err
		}
	}
	return values, nil
}

// upgradeInstall is `helm upgrade --install --wait --timeout timeout` of
// chrt with values as release name in namespace, on the cluster kubeconfig
// names, with Helm's default storage (Secrets).
func upgradeInstall(kubeconfig, name, namespace string, chrt *chart.Chart, values map[string]interface{}, timeout time.Duration) (*release.Release, error) {
	flags := genericclioptions.NewConfigFlags(true)
	flags.KubeConfig = &kubeconfig
	flags.Namespace = &namespace
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, namespace, "secret", log.Printf); err != nil {
		return nil, fmt.Errorf("the cluster of %s: %w", kubeconfig, err)
	}
	history := action.NewHistory(cfg)
	history.Max = 1
	versions, err := history.Run(name)
	uninstalled := len(versions) > 0 && versions[len(versions)-1].Info.Status == release.StatusUninstalled
	if errors.Is(err, driver.ErrReleaseNotFound) || uninstalled {
		log.Printf("render-chart: release %q does not exist, installing it", name)
		install := action.NewInstall(cfg)
		install.ReleaseName = name
		install.Namespace = namespace
		install.Wait = true
		install.Timeout = timeout
		// As the CLI: a release uninstalled with its history kept is
		// installed again under its name.
		install.Replace = uninstalled
		return install.Run(chrt, values)
	}
	if err != nil {
		return nil, fmt.Errorf("the history of release %q: %w", name, err)
	}
	upgrade := action.NewUpgrade(cfg)
	upgrade.Namespace = namespace
	upgrade.Wait = true
	upgrade.Timeout = timeout
	return upgrade.Run(name, chrt, values)
}

func main() {
	chartDir := flag.String("chart", "", "the chart's directory (required)")
	name := flag.String("name", "amd-gpu", "the release name")
	namespace := flag.String("namespace", "kube-system", "the release namespace")
	kubeVersion := flag.String("kube-version", "v1.36.3", "the cluster's Kubernetes version")
	kubeconfig := flag.String("kubeconfig", "", "upgrade --install --wait on this cluster instead of printing")
	timeout := flag.Duration("timeout", 5*time.Minute, "with -kubeconfig: how long Helm waits for the release to be ready")
	var files, sets repeated
	flag.Var(&files, "values", "a values file (repeatable; later ones win)")
	flag.Var(&sets, "set-json", "KEY=JSON, KEY a dotted path (repeatable; after the files)")
	flag.Parse()
	if *chartDir == "" {
		log.Fatal("render-chart: --chart is required")
	}
	chart, err := loader.Load(*chartDir)
	if err != nil {
		log.Fatalf("render-chart: loading %s: %v", *chartDir, err)
	}
	values, err := userValues(files, sets)
	if err != nil {
		log.Fatalf("render-chart: %v", err)
	}
	if *kubeconfig != "" {
		rel, err := upgradeInstall(*kubeconfig, *name, *namespace, chart, values, *timeout)
		if err != nil {
			log.Fatalf("render-chart: upgrade --install %s: %v", *name, err)
		}
		fmt.Printf("release %s revision %d %s\n", rel.Name, rel.Version, rel.Info.Status)
		return
	}
	version, err := chartutil.ParseKubeVersion(*kubeVersion)
	if err != nil {
		log.Fatalf("render-chart: --kube-version %s: %v", *kubeVersion, err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = *version
	release := chartutil.ReleaseOptions{Name: *name, Namespace: *namespace, Revision: 1, IsInstall: true}
	top, err := chartutil.ToRenderValues(chart, values, release, caps)
	if err != nil {
		log.Fatalf("render-chart: the values: %v", err)
	}
	rendered, err := engine.Render(chart, top)
	if err != nil {
		log.Fatalf("render-chart: %v", err)
	}
	names := make([]string, 0, len(rendered))
	for file := range rendered {
		names = append(names, file)
	}
	sort.Strings(names)
	for _, file := range names {
		text := strings.TrimSpace(rendered[file])
		if text == "" || path.Base(file) == "NOTES.txt" {
			continue
		}
		fmt.Printf("---\n# Source: %s\n%s\n", file, text)
	}
	os.Exit(0)
}
