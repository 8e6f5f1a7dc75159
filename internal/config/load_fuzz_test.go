package config

import (
	"reflect"
	"testing"
)

// FuzzLoadFile: any config file loads or fails with an error, never a
// panic; a file that loads gives a valid Config, the same one every time.
func FuzzLoadFile(f *testing.F) {
	for _, s := range []string{
		"pool-size: 1GiB\nlock-timeout: 30s\n",
		"transport: tcp\nnics: 2\nqps-per-peer: 4\ntcp-data-listen: 127.0.0.1:0\n",
		"listen: 0.0.0.0:50055\nadvertise: 10.0.0.1:50055\n",
		"lock-timeout: 2s\nlock-max-lifetime: 1s\n",
		"pool-size: -1\n",
		"unknown-key: 1\n",
		"nics: mlx5_0,mlx5_1\n",
		"- a\n- b\n",
		"pool-size: [1, 2]\n",
		"gc-interval: 1h\nshutdown-timeout: 0s\n",
		"log-level: trace\nlog-format: console\npeer-reflection: true\n",
		"tcp-qpn-start: 16777215\n",
		"&a [*a]",
		":\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, file string) {
		if file == "" {
			return // no file: the defaults, covered by TestDefaults
		}
		c, err := load(t, nil, nil, file)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Load returned a config that does not validate: %v", err)
		}
		again, err := load(t, nil, nil, file)
		if err != nil {
			t.Fatalf("second load failed: %v", err)
		}
		c.File, again.File = "", ""
		if !reflect.DeepEqual(c, again) {
			t.Fatalf("two loads of one file differ:\n%+v\n%+v", c, again)
		}
	})
}
