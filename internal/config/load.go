package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// Load builds the Config from fs (already parsed, registered with
// RegisterFlags), the PEGAD_* environment and the config file named by
// --config or PEGAD_CONFIG, over the defaults d; then validates it. Every
// error is ErrInvalid.
func Load(fs *pflag.FlagSet, d Config) (Config, error) {
	c, err := loadConfig(fs, d)
	return c, Invalid(err)
}

func loadConfig(fs *pflag.FlagSet, d Config) (Config, error) {
	v := viper.New()
	v.SetEnvPrefix(EnvPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_", ".", "_"))
	v.AutomaticEnv()
	setDefaults(v, d)

	// Bind only the key flags: --config is not a key (a file cannot name
	// another file).
	known := map[string]bool{}
	for _, k := range Keys() {
		known[k] = true
		if f := fs.Lookup(k); f != nil {
			if err := v.BindPFlag(k, f); err != nil {
				return Config{}, fmt.Errorf("config: bind flag %s: %w", k, err)
			}
		}
	}

	file := ""
	if f := fs.Lookup(FlagConfig); f != nil && f.Changed {
		file = f.Value.String()
	} else if e, ok := os.LookupEnv(EnvPrefix + "_CONFIG"); ok {
		file = e
	}
	if file != "" {
		settings, err := readFile(file, known)
		if err != nil {
			return Config{}, err
		}
		if err := v.MergeConfigMap(settings); err != nil {
			return Config{}, fmt.Errorf("config: %s: %w", file, err)
		}
	}

	var c Config
	if err := v.Unmarshal(&c, func(dc *mapstructure.DecoderConfig) {
		dc.DecodeHook = decodeHook()
		dc.ErrorUnused = true
	}); err != nil {
		return Config{}, fmt.Errorf("config: %s", withSources(cleanDecodeError(err), fs, file))
	}
	c.File = file
	if len(c.NamespaceQuota) == 0 {
		c.NamespaceQuota = nil // as Default(): an empty flag or key is none
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func setDefaults(v *viper.Viper, d Config) {
	rv := reflect.ValueOf(d)
	rt := rv.Type()
	for i := 0; i < rt.NumField(); i++ {
		k := rt.Field(i).Tag.Get("mapstructure")
		if k == "" || k == "-" {
			continue
		}
		switch x := rv.Field(i).Interface().(type) {
		case ByteSize:
			v.SetDefault(k, uint64(x))
		default:
			v.SetDefault(k, x)
		}
	}
}

// readFile reads the YAML file and rejects keys that are not settings.
func readFile(path string, known map[string]bool) (map[string]any, error) {
	fv := viper.New()
	fv.SetConfigFile(path)
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yaml", ".yml", ".json", ".toml":
	default:
		fv.SetConfigType("yaml")
	}
	if err := fv.ReadInConfig(); err != nil {
		return nil, fmt.Errorf("config: read %s: %w", path, err)
	}
	var unknown []string
	guessed := true
	for _, k := range fv.AllKeys() {
		if !known[k] {
			unknown = append(unknown, k+": "+unknownKeyReason(k))
			guessed = guessed && closestKey(k) != ""
		}
	}
	if len(unknown) == 0 {
		return fv.AllSettings(), nil
	}
	sort.Strings(unknown)
	msg := fmt.Sprintf("config: %s: %s", path, strings.Join(unknown, "; "))
	if !guessed {
		// A key nothing is close to: the list is the reader's only help.
		msg += " (valid keys: " + strings.Join(Keys(), ", ") + ")"
	}
	return nil, errors.New(msg)
}

var (
	byteSizeType = reflect.TypeOf(ByteSize(0))
	durationType = reflect.TypeOf(time.Duration(0))
)

// decodeHook decodes the keys that are not strings, numbers or bools:
// sizes, durations, and lists (from a YAML list, or a comma list in a
// flag, an env value or a string).
func decodeHook() mapstructure.DecodeHookFunc {
	return mapstructure.ComposeDecodeHookFunc(byteSizeHook, durationHook, mapstructure.StringToSliceHookFunc(","))
}

// byteSizeHook decodes sizes from strings ("256MiB") and non-negative numbers.
func byteSizeHook(from, to reflect.Type, data any) (any, error) {
	if to != byteSizeType {
		return data, nil
	}
	switch x := data.(type) {
	case string:
		return ParseByteSize(x)
	case int:
		if x < 0 {
			return nil, fmt.Errorf("negative size %d", x)
		}
		return ByteSize(x), nil
	case int64:
		if x < 0 {
			return nil, fmt.Errorf("negative size %d", x)
		}
		return ByteSize(x), nil
	case uint64:
		return ByteSize(x), nil
	case uint:
		return ByteSize(x), nil
	case float64:
		if x < 0 {
			return nil, fmt.Errorf("negative size %v", x)
		}
		return ByteSize(x), nil
	}
	return data, nil
}

// durationHook decodes durations from strings with a unit ("120s"); a bare
// number is refused rather than read as nanoseconds.
func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != durationType {
		return data, nil
	}
	switch x := data.(type) {
	case string:
		d, err := time.ParseDuration(strings.TrimSpace(x))
		if err != nil {
			return nil, fmt.Errorf("invalid duration %q (use a unit, e.g. 120s, 500ms, 2m)", x)
		}
		return d, nil
	case time.Duration:
		return x, nil
	case int, int64, uint64, float64:
		return nil, fmt.Errorf("invalid duration %v: a bare number has no unit (write e.g. \"%vs\")", x, x)
	}
	return data, nil
}

// cleanDecodeError turns mapstructure's multi-line report into one line.
func cleanDecodeError(err error) string {
	s := err.Error()
	s = strings.TrimPrefix(s, "decoding failed due to the following error(s):")
	parts := strings.Split(s, "\n")
	var out []string
	for _, p := range parts {
		p = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(p), "*"))
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, "; ")
}
