package ctl

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
)

// progressEvery is how often a prefetch's progress line is redrawn.
var progressEvery = 250 * time.Millisecond

// stderrIsTerminal decides whether progress lines are drawn; tests
// replace it.
var stderrIsTerminal = isTerminal

// progress draws one self-overwriting status line on a terminal's stderr
// while a prefetch runs: its phase, blocks, bytes done of total, rate and
// ETA, from pegad's list of in-flight fetches. It never writes to stdout,
// so results and JSON stay clean, and erases its line before returning.
type progress struct {
	w       io.Writer
	peer    string
	started time.Time
	drawn   bool
}

// run polls c until ctx ends.
func (p *progress) run(ctx context.Context, c *pegaclient.Client) {
	t := time.NewTicker(progressEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			p.clear()
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, progressEvery)
		res, err := c.Admin().ListSessions(pctx, &pegadv1.ListSessionsRequest{})
		cancel()
		if err != nil {
			continue // the prefetch itself reports failures
		}
		if f := p.find(res.GetFetches()); f != nil {
			p.draw(f)
		}
	}
}

// find is our fetch: the youngest to this peer that started no earlier
// than we asked (pegactl does not learn the req_id before the answer).
func (p *progress) find(fs []*pegadv1.Fetch) *pegadv1.Fetch {
	var best *pegadv1.Fetch
	limit := time.Since(p.started) + time.Second
	for _, f := range fs {
		if f.GetPeer() != p.peer || f.GetAge().AsDuration() > limit {
			continue
		}
		if best == nil || f.GetAge().AsDuration() < best.GetAge().AsDuration() {
			best = f
		}
	}
	return best
}

func (p *progress) draw(f *pegadv1.Fetch) {
	line := progressLine(f, time.Since(p.started))
	fmt.Fprintf(p.w, "\r%s\033[K", line)
	p.drawn = true
}

// progressLine: "prefetch 10.0.0.1:50055: read 381 blocks, 512.0 MiB of
// 1.4 GiB (35%), 120.3 MiB/s, ETA 8s, 4.3s".
func progressLine(f *pegadv1.Fetch, elapsed time.Duration) string {
	parts := []string{fmt.Sprintf("prefetch %s: %s", f.GetPeer(), dash(f.GetPhase()))}
	if n := f.GetBlocks(); n > 0 {
		parts[0] += fmt.Sprintf(" %d blocks", n)
	}
	total, done := f.GetBytes(), f.GetBytesDone()
	switch {
	case total > 0 && done > 0:
		parts = append(parts, fmt.Sprintf("%s of %s (%d%%)", humanBytes(done), humanBytes(total), done*100/total))
		if secs := f.GetAge().AsDuration().Seconds(); secs > 0 {
			rate := float64(done) / secs
			parts = append(parts, humanBytes(uint64(rate))+"/s")
			if done < total && rate > 0 {
				parts = append(parts, "ETA "+humanDur(time.Duration(float64(total-done)/rate*float64(time.Second)).Round(time.Second)))
			}
		}
	case total > 0:
		parts = append(parts, humanBytes(total))
	}
	parts = append(parts, humanDur(elapsed))
	return strings.Join(parts, ", ")
}

func (p *progress) clear() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}
