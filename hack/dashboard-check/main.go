// Command dashboard-check validates Grafana dashboard JSON files against Grafana's dashboard
// schema, as the Grafana Foundation SDK generates it: a strict decoding (unknown fields, wrong
// types and missing required fields are errors) and the schema's constraints (Validate). It
// is how tests/monitoring.rs checks deploy/monitoring/dashboard.json without a Grafana.
//
//	dashboard-check FILE...
//
// Grafana fills in some required fields itself when it loads a dashboard: the panel plugins'
// option defaults and the built-in annotation query. The ones listed in acceptedDefaults may
// be missing; every other finding fails the check (exit status 1). Panel types and data
// source types the program does not know fail too, since their content would go unchecked.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// panelPlugins are the panel types whose options and field config are decoded strictly.
// Rows have no options of their own.
var panelPlugins = map[string]variants.PanelcfgConfig{
	"stat":       stat.VariantConfig(),
	"timeseries": timeseries.VariantConfig(),
}

// dataSources are the data source types whose queries are decoded strictly.
var dataSources = map[string]variants.DataqueryConfig{
	"prometheus": prometheus.VariantConfig(),
}

// missing is the message of a required field absent from the input.
const missing = "required field is missing from input"

// acceptedDefaults are the required fields that may be missing, by panel type ("" for the
// dashboard itself), as paths below the panel. Grafana fills each in when it loads the
// dashboard, with the default of the panel plugin (or of the dashboard model):
var acceptedDefaults = map[string][]string{
	// The built-in "Annotations & Alerts" query, which Grafana adds to every dashboard.
	"": {"annotations"},
	// The stat panel's display defaults: graphMode "area", colorMode "value", justifyMode
	// "auto", textMode "auto", wideLayout true, showPercentChange false,
	// percentChangeColorMode "standard", orientation "auto".
	"stat": {
		"options.graphMode", "options.colorMode", "options.justifyMode", "options.textMode",
		"options.wideLayout", "options.showPercentChange", "options.percentChangeColorMode",
		"options.orientation",
	},
	// The time series panel's legend and tooltip defaults: legend shown without calculations,
	// tooltip mode "single", sort "none".
	"timeseries": {"options.legend.showLegend", "options.legend.calcs", "options.tooltip"},
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dashboard-check FILE...")
		os.Exit(2)
	}
	runtime := cog.NewRuntime()
	for _, config := range panelPlugins {
		runtime.RegisterPanelcfgVariant(config)
	}
	for _, config := range dataSources {
		runtime.RegisterDataqueryVariant(config)
	}
	failed := false
	for _, file := range os.Args[1:] {
		problems, accepted, err := check(file)
		if err != nil {
			fmt.Printf("%s: %v\n", file, err)
			failed = true
			continue
		}
		for _, p := range problems {
			fmt.Printf("%s: %s\n", file, p)
		}
		if len(problems) > 0 {
			failed = true
			continue
		}
		fmt.Printf("%s: ok (%d missing fields accepted as defaults Grafana fills in)\n", file, accepted)
	}
	if failed {
		os.Exit(1)
	}
}

// check returns the problems of one dashboard file and the number of accepted defaults.
func check(file string) (problems []string, accepted int, err error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, 0, err
	}
	var tree map[string]any
	if err := json.Unmarshal(raw, &tree); err != nil {
		return nil, 0, fmt.Errorf("not JSON: %w", err)
	}
	problems = append(problems, unknownPlugins(tree)...)

	var board dashboard.Dashboard
	var findings cog.BuildErrors
	for _, err := range []error{board.UnmarshalJSONStrict(raw), board.Validate()} {
		if err == nil {
			continue
		}
		var buildErrs cog.BuildErrors
		if !errors.As(err, &buildErrs) {
			return nil, 0, err
		}
		findings = append(findings, buildErrs...)
	}
	for _, f := range findings {
		if f.Message == missing && isAcceptedDefault(tree, f.Path) {
			accepted++
			continue
		}
		problems = append(problems, f.Error())
	}
	sort.Strings(problems)
	return problems, accepted, nil
}

// unknownPlugins names the panels and queries whose type is not registered above.
func unknownPlugins(tree map[string]any) (problems []string) {
	var walk func(path string, panels []any)
	walk = func(path string, panels []any) {
		for i, p := range panels {
			panel, _ := p.(map[string]any)
			at := fmt.Sprintf("%s[%d]", path, i)
			kind, _ := panel["type"].(string)
			if _, known := panelPlugins[kind]; !known && kind != "row" {
				problems = append(problems, fmt.Sprintf("%s: panel type %q is not checked: register its plugin in hack/dashboard-check", at, kind))
			}
			targets, _ := panel["targets"].([]any)
			for j, t := range targets {
				target, _ := t.(map[string]any)
				source, _ := target["datasource"].(map[string]any)
				if source == nil {
					source, _ = panel["datasource"].(map[string]any)
				}
				kind, _ := source["type"].(string)
				if _, known := dataSources[kind]; !known {
					problems = append(problems, fmt.Sprintf("%s.targets[%d]: data source type %q is not checked: register it in hack/dashboard-check", at, j, kind))
				}
			}
			nested, _ := panel["panels"].([]any)
			walk(at+".panels", nested)
		}
	}
	panels, _ := tree["panels"].([]any)
	walk("panels", panels)
	return problems
}

var panelIndex = regexp.MustCompile(`^panels\[(\d+)\]\.`)

// isAcceptedDefault tells whether the missing field at path (`panels[3].options.tooltip`) is
// in acceptedDefaults for the type of the panel it belongs to.
func isAcceptedDefault(tree map[string]any, path string) bool {
	kind, rest := "", path
	node := tree
	for {
		m := panelIndex.FindStringSubmatch(rest)
		if m == nil {
			break
		}
		i, _ := strconv.Atoi(m[1])
		panels, _ := node["panels"].([]any)
		if i >= len(panels) {
			return false
		}
		node, _ = panels[i].(map[string]any)
		kind, _ = node["type"].(string)
		rest = strings.TrimPrefix(rest, m[0])
	}
	for _, accepted := range acceptedDefaults[kind] {
		if rest == accepted {
			return true
		}
	}
	return false
}
