package prices

import (
	"cmp"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Matcher finds which of a set of GPU names (a price catalog's models, a
// table of peaks) a GPU name denotes, typically a name as NVML reports it
// ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB")
// among names as vast.ai gives them ("H100 SXM", "A100 SXM4", "Tesla V100").
// Names are read as tokens (case-insensitive; spaces, dashes, underscores,
// slashes, commas and parentheses separate them):
//
//   - vendor and line words are dropped: NVIDIA, GeForce, Tesla, Quadro (and
//     vast.ai's "Q" for Quadro: "Q RTX 8000"), and the "Generation" of
//     "RTX 6000 Ada Generation";
//   - memory sizes ("80GB", "16 GB") and memory types ("HBM3", "HBM2e",
//     "GDDR6X") are not part of the model, but a memory size stated by both
//     names must agree;
//   - the form factor (SXM, SXM2…SXM5, PCIe, NVL) is not part of the model
//     either, but decides between variants: two names that both state one
//     must state the same. A name that states none is read as the SXM board
//     or a GPU with one form only: NVML and vast.ai leave the form factor out
//     only there ("NVIDIA H100 80GB HBM3", "NVIDIA H200", vast.ai's "H200")
//     and say "PCIe" or "NVL" otherwise. So "NVIDIA H100 80GB HBM3" matches
//     "H100 SXM" and not "H100 PCIE";
//   - the remaining tokens, the model ("h100"; "rtx 4090"; "a10g"), must be
//     the same set on both sides: whole tokens, never substrings, so "A10G"
//     is neither "A10" nor "A100", "RTX A1000" is not "A100", "T400" is not
//     "T4", and "RTX 3080 Ti" is not "RTX 3080".
//
// A name equal to a candidate by Key is that candidate. Otherwise, of the
// candidates that match, the one agreeing on the most stated attributes
// (form factor, memory size) wins; ties go to the first name in sort order.
// No match is better than a wrong one: the price or the peak of another GPU
// would be silently wrong.
type Matcher struct {
	names  []string
	keys   map[string]int
	models []GPUModel
}

// NewMatcher returns a matcher over names.
func NewMatcher(names []string) *Matcher {
	m := &Matcher{names: append([]string(nil), names...), keys: make(map[string]int, len(names)), models: make([]GPUModel, len(names))}
	for i, n := range m.names {
		if _, dup := m.keys[Key(n)]; !dup {
			m.keys[Key(n)] = i
		}
		m.models[i] = ParseGPUModel(n)
	}
	return m
}

// Match returns the index among the matcher's names of the one name
// denotes; ok is false when none does.
func (m *Matcher) Match(name string) (int, bool) {
	k := Key(name)
	if k == "" {
		return -1, false
	}
	if i, ok := m.keys[k]; ok {
		return i, true
	}
	q := ParseGPUModel(name)
	best, bestScore := -1, -1
	for i, c := range m.models {
		s := q.score(c)
		if s < 0 {
			continue
		}
		if s > bestScore || (s == bestScore && m.names[i] < m.names[best]) {
			best, bestScore = i, s
		}
	}
	return best, best >= 0
}

// MatchName is Match returning the matched name.
func (m *Matcher) MatchName(name string) (string, bool) {
	i, ok := m.Match(name)
	if !ok {
		return "", false
	}
	return m.names[i], true
}

// GPUModel is a GPU name as the Matcher reads it.
type GPUModel struct {
	// Tokens of the model, sorted (vendor words, memory and form factor
	// removed).
	Tokens []string
	Form   string // the stated form factor: "sxm", "pcie", "nvl", or "" (none)
	MemGB  int    // the stated memory size in GB; 0 if none
}

var (
	vendorWords = map[string]bool{"nvidia": true, "geforce": true, "tesla": true, "quadro": true, "q": true, "generation": true}
	memSizeRe   = regexp.MustCompile(`^([0-9]+)(gb|gib)$`)
	memTypeRe   = regexp.MustCompile(`^(hbm[0-9]?e?|gddr[0-9]+x?)$`)
	sxmRe       = regexp.MustCompile(`^sxm[0-9]?$`)
)

func isSep(r rune) bool { return strings.ContainsRune(" \t-_/,()", r) }

// ParseGPUModel reads a GPU name for matching (the rules are Matcher's).
func ParseGPUModel(name string) GPUModel {
	m := parseGPUName(name)
	sort.Strings(m.Tokens)
	return m
}

// parseGPUName is ParseGPUModel with the tokens in the name's order.
func parseGPUName(name string) GPUModel {
	var m GPUModel
	f := strings.FieldsFunc(strings.ToLower(name), isSep)
	for i := 0; i < len(f); i++ {
		t := f[i]
		switch {
		case vendorWords[t], memTypeRe.MatchString(t):
		case memSizeRe.MatchString(t):
			m.MemGB, _ = strconv.Atoi(memSizeRe.FindStringSubmatch(t)[1])
		case isDigits(t) && i+1 < len(f) && (f[i+1] == "gb" || f[i+1] == "gib"): // "80 GB"
			m.MemGB, _ = strconv.Atoi(t)
			i++
		case sxmRe.MatchString(t):
			m.Form = "sxm"
		case t == "pcie" || t == "nvl":
			m.Form = t
		default:
			m.Tokens = append(m.Tokens, t)
		}
	}
	return m
}

func isDigits(s string) bool { return s != "" && strings.Trim(s, "0123456789") == "" }

// score says whether the candidate c names the GPU that q names, and on
// how many stated attributes they agree; -1: it does not.
func (q GPUModel) score(c GPUModel) int {
	if len(q.Tokens) == 0 || !slices.Equal(q.Tokens, c.Tokens) {
		return -1
	}
	s := 0
	switch {
	case q.Form != "" && c.Form != "":
		if q.Form != c.Form {
			return -1
		}
		s++
	case q.Form+c.Form != "" && q.Form+c.Form != "sxm":
		// One side states PCIe or NVL; the other's unstated form is SXM
		// (or the only one).
		return -1
	}
	if q.MemGB > 0 && c.MemGB > 0 {
		if q.MemGB != c.MemGB {
			return -1
		}
		s++
	}
	return s
}

// multiForm are the GPU models sold in more than one form factor (SXM,
// PCIe, NVL): only for them the form factor is part of the model.
var multiForm = map[string]bool{"p100": true, "v100": true, "a100": true, "a800": true, "h100": true, "h800": true, "h200": true}

// CanonicalGPUName is the name offers of one GPU model are grouped and
// shown under, whichever provider lists them and however it spells the
// model: the model's tokens as ParseGPUModel reads them, in their order,
// upper-cased, and for a model sold in several form factors (A100, H100,
// H200, V100, …) its form: "SXM" when the name states SXM or none (the
// Matcher's rule), else "PCIE" or "NVL". Memory sizes are left out, as
// vast.ai's names leave them out (its "A100 SXM4" is the 40 and the 80 GB
// card). So vast.ai's "H100 SXM", Lambda's "H100 (80 GB SXM5)", RunPod's
// "H100 SXM" and NVML's "NVIDIA H100 80GB HBM3" are all "H100 SXM";
// "A10 (24 GB PCIe)" and "NVIDIA A10" are "A10"; "NVIDIA GeForce RTX 4090"
// is "RTX 4090". A name with no model token is returned trimmed.
func CanonicalGPUName(name string) string {
	m := parseGPUName(name)
	if len(m.Tokens) == 0 {
		return strings.TrimSpace(name)
	}
	if len(m.Tokens) == 1 && multiForm[m.Tokens[0]] {
		form := cmp.Or(m.Form, "sxm")
		m.Tokens = append(m.Tokens, form)
	}
	return strings.ToUpper(strings.Join(m.Tokens, " "))
}
