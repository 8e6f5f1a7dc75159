package config

import (
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// decodePart is one key's decode failure in cleanDecodeError's output.
var decodePart = regexp.MustCompile(`^'([a-z0-9-]+)' (.*)$`)

// strconvReason turns mapstructure's "cannot parse value as 'int':
// strconv.ParseInt: invalid syntax" into words.
var strconvReason = regexp.MustCompile(`cannot parse value as '(\w+)': strconv\.\w+: (.*)$`)

// withSources rewrites each "'key' reason" part of a decode error so that
// it names where the bad value came from: the flag, the PEGAD_* variable
// and its value, or the config file. An operator who set
// PEGAD_QPS_PER_PEER=two reads that, not a bare strconv error.
func withSources(msg string, fs *pflag.FlagSet, file string) string {
	parts := strings.Split(msg, "; ")
	for i, p := range parts {
		m := decodePart.FindStringSubmatch(p)
		if m == nil {
			continue
		}
		key, reason := m[1], m[2]
		if r := strconvReason.FindStringSubmatch(reason); r != nil {
			what := map[string]string{"int": "an integer", "uint32": "a non-negative integer", "uint64": "a non-negative integer", "bool": "true or false"}[r[1]]
			if what == "" {
				what = "a valid " + r[1]
			}
			reason = "is not " + what + " (" + r[2] + ")"
		}
		env := EnvName(key)
		src := key
		if f := fs.Lookup(key); f != nil && f.Changed {
			src += " (--" + key + " " + f.Value.String() + ")"
		} else if v, ok := os.LookupEnv(env); ok {
			src += " (" + env + "=" + strconv.Quote(v) + ")"
		} else if file != "" {
			src += " (in " + file + ")"
		}
		parts[i] = src + ": " + reason
	}
	return strings.Join(parts, "; ")
}
