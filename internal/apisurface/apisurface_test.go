// SPDX-License-Identifier: Apache-2.0

package apisurface

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The counting rules on a fixture: what go doc -all lists counts, unexported names, test files
// and the fields of unexported types do not.
func TestCount(t *testing.T) {
	s, err := Count("testdata/sample")
	require.NoError(t, err)
	require.Equal(t, []string{
		"A", "F", "I", "I.Closer", "I.Do", "K", "K1", "K2", "NewT", "T", "T.M", "T.Reader", "T.X", "T.Y", "V",
	}, s.Names)
}

// Every public package of the repository (not internal/, cmd/ or examples/) within its budget;
// -v prints the table and the user packages' total against UserGoal.
func TestRepository_APISurface(t *testing.T) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	require.NoError(t, err)
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	out, err := exec.Command("go", "list", "-json=Dir,ImportPath", root+"/...").Output()
	require.NoError(t, err)

	counts := map[string]int{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct{ Dir, ImportPath string }
		require.NoError(t, dec.Decode(&p))
		rel, err := filepath.Rel(root, p.Dir)
		require.NoError(t, err)
		if public(rel) {
			s, err := Count(p.Dir)
			require.NoError(t, err)
			counts[rel] = s.Len()
		}
	}
	require.NotEmpty(t, counts)

	var rels, over []string
	for rel := range counts {
		rels = append(rels, rel)
	}
	sort.Strings(rels)
	for _, rel := range rels {
		budget, ok := Budgets[rel]
		t.Logf("%-36s %4d (budget %d)", rel, counts[rel], budget)
		switch {
		case !ok:
			over = append(over, fmt.Sprintf("  %s: %d exported identifiers and no budget: add one to apisurface.Budgets", rel, counts[rel]))
		case counts[rel] > budget:
			over = append(over, fmt.Sprintf("  %s: %d exported identifiers, budget %d: unexport or move to internal/ what users do not call", rel, counts[rel], budget))
		}
	}
	total := 0
	for _, rel := range UserPackages {
		total += counts[rel]
	}
	t.Logf("user packages %v: %d in all (goal %d)", UserPackages, total, UserGoal)
	if len(over) > 0 {
		require.FailNow(t, "packages over their API budget (internal/apisurface.Budgets)", "\n%s", strings.Join(over, "\n"))
	}
}

func public(rel string) bool {
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		if part == "internal" || part == "testdata" {
			return false
		}
	}
	first := strings.Split(rel, string(filepath.Separator))[0]
	return first != "cmd" && first != "examples"
}
