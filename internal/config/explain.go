package config

// What `pegad config print` and `pegad config check` need: the effective
// configuration with each key's source, and every problem of a config
// file at once.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"
)

// Source is where a key's effective value came from.
type Source string

// Sources, lowest precedence first.
const (
	SourceDefault Source = "default"
	SourceFile    Source = "file"
	SourceEnv     Source = "env"
	SourceFlag    Source = "flag"
)

// Effective is a loaded Config with the source of each key.
type Effective struct {
	Config  Config
	Sources map[string]Source // key → source, for every key of Keys()
}

// LoadEffective is Load, plus where each key's value came from (the same
// precedence Load applies: flag > env > file > default). Every error is
// ErrInvalid.
func LoadEffective(fs *pflag.FlagSet, d Config) (Effective, error) {
	c, err := Load(fs, d)
	if err != nil {
		return Effective{}, err
	}
	inFile := map[string]bool{}
	if c.File != "" {
		known := map[string]bool{}
		for _, k := range Keys() {
			known[k] = true
		}
		settings, err := readFile(c.File, known)
		if err != nil {
			return Effective{}, Invalid(err)
		}
		for k := range settings {
			inFile[k] = true
		}
	}
	e := Effective{Config: c, Sources: make(map[string]Source)}
	for _, k := range Keys() {
		src := SourceDefault
		switch {
		case fs.Lookup(k) != nil && fs.Lookup(k).Changed:
			src = SourceFlag
		case os.Getenv(EnvName(k)) != "": // viper ignores empty variables
			src = SourceEnv
		case inFile[k]:
			src = SourceFile
		}
		e.Sources[k] = src
	}
	return e, nil
}

// EnvName is the environment variable of key (pool-size → PEGAD_POOL_SIZE).
func EnvName(key string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(key, "-", "_"))
}

// WriteYAML writes e as a YAML config file, one key a line in Keys() order,
// each with its source as a line comment. The output is itself a valid
// config file with the same effect.
func (e Effective) WriteYAML(w io.Writer) error {
	doc := &yaml.Node{Kind: yaml.MappingNode}
	values := keyValues(e.Config)
	for _, k := range Keys() {
		src := string(e.Sources[k])
		switch e.Sources[k] {
		case SourceEnv:
			src += " " + EnvName(k)
		case SourceFlag:
			src += " --" + k
		case SourceFile:
			src += " " + e.Config.File
		}
		doc.Content = append(doc.Content,
			&yaml.Node{Kind: yaml.ScalarNode, Value: k},
			&yaml.Node{Kind: yaml.ScalarNode, Tag: values[k].tag, Value: values[k].text, LineComment: src})
	}
	head := "# pegad effective configuration: each key's value and where it came from\n" +
		"# (precedence: flag > env > file > default).\n"
	if e.Config.File != "" {
		head += "# config file: " + e.Config.File + "\n"
	}
	if _, err := io.WriteString(w, head); err != nil {
		return err
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{doc}}); err != nil {
		return err
	}
	return enc.Close()
}

type yamlValue struct{ tag, text string }

// keyValues renders each key's value the way the file takes it back.
func keyValues(c Config) map[string]yamlValue {
	out := map[string]yamlValue{}
	rv := reflect.ValueOf(c)
	rt := rv.Type()
	for i := 0; i < rt.NumField(); i++ {
		k := rt.Field(i).Tag.Get("mapstructure")
		if k == "" || k == "-" {
			continue
		}
		var v yamlValue
		switch x := rv.Field(i).Interface().(type) {
		case ByteSize:
			v = yamlValue{"!!str", x.String()}
		case time.Duration:
			v = yamlValue{"!!str", x.String()}
		case string:
			v = yamlValue{"!!str", x}
		case bool:
			v = yamlValue{"!!bool", strconv.FormatBool(x)}
		case int:
			v = yamlValue{"!!int", strconv.Itoa(x)}
		case uint32:
			v = yamlValue{"!!int", "0x" + strconv.FormatUint(uint64(x), 16)}
		case []string: // read back as a comma list (namespace-quota)
			v = yamlValue{"!!str", strings.Join(x, ",")}
		default:
			v = yamlValue{"!!str", fmt.Sprint(x)}
		}
		out[k] = v
	}
	return out
}

// Problem is one bad key of a configuration.
type Problem struct {
	Key    string
	Reason string
}

func (p Problem) String() string { return p.Key + ": " + p.Reason }

// ErrUnreadable: the config file could not be read or parsed at all.
var ErrUnreadable = errors.New("config file unreadable")

// CheckFile validates the config file at path on its own (over the
// defaults, without environment or flags) and returns every problem, not
// just the first: unknown keys, values that do not parse, values out of
// range. An unreadable or unparsable file is ErrUnreadable.
func CheckFile(path string) ([]Problem, error) {
	fv := viper.New()
	fv.SetConfigFile(path)
	fv.SetConfigType("yaml")
	if err := fv.ReadInConfig(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnreadable, path, err)
	}
	known := map[string]bool{}
	for _, k := range Keys() {
		known[k] = true
	}
	var probs []Problem
	c := Default()
	for _, k := range fv.AllKeys() {
		if !known[k] {
			probs = append(probs, Problem{k, unknownKeyReason(k)})
			continue
		}
		// One key at a time, so each bad value is reported on its own.
		one := c
		dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
			DecodeHook:       decodeHook(),
			WeaklyTypedInput: true,
			Result:           &one,
		})
		if err != nil {
			return nil, err
		}
		if err := dec.Decode(map[string]any{k: fv.Get(k)}); err != nil {
			probs = append(probs, Problem{k, decodeReason(k, err)})
			continue
		}
		c = one
	}
	probs = append(probs, c.problems()...)
	sort.SliceStable(probs, func(i, j int) bool { return probs[i].Key < probs[j].Key })
	return probs, nil
}

// decodeReason is mapstructure's message without its key prefix.
func decodeReason(key string, err error) string {
	s := cleanDecodeError(err)
	s = strings.TrimPrefix(s, "'"+key+"' ")
	return s
}

// unknownKeyReason says why k is refused, with the nearest settable key
// when one is close: config check and serve's start-up both use it, so a
// typo gets the same suggestion whichever finds it.
func unknownKeyReason(k string) string {
	if s := closestKey(k); s != "" {
		return fmt.Sprintf("unknown key (did you mean %s?)", s)
	}
	return "unknown key"
}

// closestKey is the settable key nearest to k by edit distance, if close.
func closestKey(k string) string {
	best, bestD := "", 3
	for _, cand := range Keys() {
		if d := editDistance(k, cand); d < bestD {
			best, bestD = cand, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
