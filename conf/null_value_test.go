package conf

import (
	"reflect"
	"testing"
)

// TestNullValueKeepsDefault: a key written with no value (YAML null, as
// "deny_commands:" is when its items are commented out) keeps the
// default, as a null section ("redlock:") and a null scalar
// ("quarantine:") do. yaml.v3 zeroes a list for null: an emptied
// upstream.deny_commands relayed FLUSHALL, CONFIG and SHUTDOWN to the
// upstream, with nothing said. An explicit [] still empties the list.
func TestNullValueKeepsDefault(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		get  func(Config) any
		want any
	}{
		{"deny_commands with its items commented out", "upstream:\n  address: 127.0.0.1:6379\n  deny_commands:\n  # - flushall\n",
			func(c Config) any { return c.Upstream.DenyCommands }, DefaultDenyCommands},
		{"deny_commands: ~", "upstream: {address: 127.0.0.1:6379, deny_commands: ~}\n",
			func(c Config) any { return c.Upstream.DenyCommands }, DefaultDenyCommands},
		{"deny_commands: [] empties it", "upstream: {address: 127.0.0.1:6379, deny_commands: []}\n",
			func(c Config) any { return c.Upstream.DenyCommands }, []string{}},
		{"quarantine:", "redlock:\n  quarantine:\n",
			func(c Config) any { return c.Redlock.Quarantine }, true},
		{"max_output_bytes:", "limits:\n  max_output_bytes:\n",
			func(c Config) any { return c.Limits.MaxOutputBytes }, 1 << 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, "c.yaml", "dev: true\n"+tt.yaml)
			c, err := Parse([]string{p}, nil)
			if err != nil {
				t.Fatalf("Parse = %v", err)
			}
			if got := tt.get(c); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("%s: got %#v; want %#v", tt.name, got, tt.want)
			}
		})
	}
}
