package ctl

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pegaflow/pegad/api/limits"
)

// result is what a command prints: an explicit struct whose json tags are
// the documented -o json shape (independent of proto field names), and
// which knows how to lay itself out as a table.
type result interface {
	writeTable(w io.Writer) error
}

// printer writes a result in the format chosen by -o.
type printer interface {
	print(r result) error
}

func (g *globalFlags) printer(w io.Writer) printer {
	if g.output == "json" {
		return jsonPrinter{w: w}
	}
	return tablePrinter{w: w}
}

type jsonPrinter struct{ w io.Writer }

func (p jsonPrinter) print(r result) error {
	enc := json.NewEncoder(p.w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

type tablePrinter struct{ w io.Writer }

func (p tablePrinter) print(r result) error {
	tw := tabwriter.NewWriter(p.w, 0, 8, 2, ' ', 0)
	if err := r.writeTable(tw); err != nil {
		return err
	}
	return tw.Flush()
}

// seconds is how every duration appears in JSON: a float number of
// seconds, in a key ending in _seconds.
func seconds(d *durationpb.Duration) float64 {
	if d == nil {
		return 0
	}
	return roundMillis(d.AsDuration().Seconds())
}

func roundMillis(s float64) float64 { return math.Round(s*1000) / 1000 }

// timestamp is how every point in time appears in JSON: RFC 3339 in UTC,
// or "" when unset.
func timestamp(t *timestamppb.Timestamp) string {
	if t == nil {
		return ""
	}
	return t.AsTime().UTC().Format(time.RFC3339Nano)
}

func humanDur(v time.Duration) string {
	switch {
	case v < 0:
		return "-" + humanDur(-v)
	case v < time.Second:
		return v.Round(time.Millisecond).String()
	case v < time.Minute:
		return v.Round(100 * time.Millisecond).String()
	default:
		return v.Round(time.Second).String()
	}
}

// humanBytes is the table form of a byte count, in IEC units.
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func hexOf(b []byte) string { return hex.EncodeToString(b) }

// parseHash parses a block hash given in hex on the command line.
func parseHash(s string) ([]byte, error) {
	if s == "" {
		return nil, usageErrorf("empty block hash")
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, usageErrorf("invalid block hash %q: not hex (%v)", s, err)
	}
	if err := limits.ValidHash(b); err != nil {
		return nil, usageErrorf("invalid block hash %q: %v", s, err)
	}
	return b, nil
}

// slotJSON is one slot's segment sizes; v_size is 0 when the slot has no V.
type slotJSON struct {
	KSize uint64 `json:"k_size"`
	VSize uint64 `json:"v_size"`
}

// slotsSummary is the table form of a block's slots: "2x(1.0 MiB+1.0 MiB)"
// when all slots are alike, else the count.
func slotsSummary(slots []slotJSON) string {
	if len(slots) == 0 {
		return "0"
	}
	same := true
	for _, s := range slots[1:] {
		if s != slots[0] {
			same = false
			break
		}
	}
	if !same {
		return fmt.Sprintf("%d (mixed)", len(slots))
	}
	s := slots[0]
	if s.VSize == 0 {
		return fmt.Sprintf("%dx%s", len(slots), humanBytes(s.KSize))
	}
	return fmt.Sprintf("%dx(%s+%s)", len(slots), humanBytes(s.KSize), humanBytes(s.VSize))
}

func humanSeconds(s float64) string {
	return humanDur(time.Duration(s * float64(time.Second)))
}
