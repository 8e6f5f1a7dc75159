package reliability

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// delayLine is a userspace stand-in for sch_netem where the kernel has
// none: a tun device in each of two hosts, host routes that send their
// traffic to each other through it, and two pumps that hold every packet
// for delay and drop a share of them. Real IP packets, real TCP
// retransmissions and RTT; only the impairment runs in this process.
type delayLine struct {
	delay   time.Duration
	lossPct int
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	files   []*os.File
	hosts   []*netns
	moved   atomic.Int64 // packets delivered
	dropped atomic.Int64
}

const tunName = "dl0"

// openTun creates tun device dl0 inside h's namespace and returns it
// (non-blocking, so Close interrupts a pending Read).
func openTun(h *netns) (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see netns.dial
		nsf, err := os.Open(filepath.Join("/run/netns", h.name))
		if err != nil {
			ch <- result{err: err}
			return
		}
		err = unix.Setns(int(nsf.Fd()), unix.CLONE_NEWNET)
		nsf.Close()
		if err != nil {
			ch <- result{err: err}
			return
		}
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- result{err: fmt.Errorf("open /dev/net/tun: %w", err)}
			return
		}
		ifr, err := unix.NewIfreq(tunName)
		if err == nil {
			ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
			err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		}
		if err == nil {
			err = unix.SetNonblock(fd, true)
		}
		if err != nil {
			unix.Close(fd)
			ch <- result{err: fmt.Errorf("tun %s in %s: %w", tunName, h.name, err)}
			return
		}
		ch <- result{f: os.NewFile(uintptr(fd), tunName)}
	}()
	r := <-ch
	return r.f, r.err
}

// newDelayLine routes a <-> b through the delay line until cleanup.
func newDelayLine(t testing.TB, a, b *netns, delay time.Duration, lossPct int) (*delayLine, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &delayLine{delay: delay, lossPct: lossPct, cancel: cancel, hosts: []*netns{a, b}}
	t.Cleanup(d.close)
	for _, h := range d.hosts {
		f, err := openTun(h)
		if err != nil {
			return nil, err
		}
		d.files = append(d.files, f)
	}
	for i, h := range d.hosts {
		peer := d.hosts[1-i]
		for _, args := range [][]string{
			{"-n", h.name, "link", "set", tunName, "mtu", "1500", "up"},
			// More specific than eth0's /24: the peer's traffic takes the line.
			{"-n", h.name, "route", "add", peer.ip + "/32", "dev", tunName, "src", h.ip},
		} {
			if err := command("ip", args...); err != nil {
				return nil, err
			}
		}
	}
	d.wg.Go(func() { d.pump(ctx, d.files[0], d.files[1]) })
	d.wg.Go(func() { d.pump(ctx, d.files[1], d.files[0]) })
	return d, nil
}

type packet struct {
	due time.Time
	b   []byte
}

// pump moves packets from src to dst, each delay late, dropping lossPct%.
func (d *delayLine) pump(ctx context.Context, src, dst *os.File) {
	q := make(chan packet, 8192)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case p := <-q:
				if w := time.Until(p.due); w > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(w):
					}
				}
				if _, err := dst.Write(p.b); err == nil {
					d.moved.Add(1)
				}
			}
		}
	})
	defer wg.Wait()
	buf := make([]byte, 65536)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return // closed at cleanup
		}
		if rand.N(100) < d.lossPct {
			d.dropped.Add(1)
			continue
		}
		select {
		case q <- packet{due: time.Now().Add(d.delay), b: append([]byte(nil), buf[:n]...)}:
		default:
			d.dropped.Add(1) // a full queue drops, as a router's would
		}
	}
}

// close stops the pumps and removes the devices (their routes go with them).
func (d *delayLine) close() {
	d.cancel()
	for _, f := range d.files {
		f.Close()
	}
	d.wg.Wait()
	d.files = nil
}
