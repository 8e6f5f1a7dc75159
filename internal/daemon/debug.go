package daemon

import (
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// serveDebug serves net/http/pprof on l (--debug-listen), as etcd and
// containerd do, so that finding where a slow prefetch spends its time needs
// no rebuild. It has its own mux: importing net/http/pprof registers on
// http.DefaultServeMux, which nothing here serves. Config allows only
// loopback addresses; profiles and goroutine dumps show keys and addresses.
func (d *Daemon) serveDebug(l net.Listener) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // also serves heap, goroutine, block, mutex, allocs, threadcreate
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// No WriteTimeout: /debug/pprof/profile and /trace stream for ?seconds=N.
	d.debugSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	d.log.Warn().Str("debug", d.debugAddr).Msg("Debug endpoints (pprof) enabled")
	d.serve("debug", func() error {
		if err := d.debugSrv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
}
