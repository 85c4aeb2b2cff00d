package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// probeLoop answers peers' reachability checks on Config.Listen (the
// verification graph connects to every peer's advertised address): each
// connection gets one line naming the node and is closed. Without Listen
// it does nothing.
func (a *agent) probeLoop(ctx context.Context) {
	if a.cfg.Listen == "" {
		return
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", a.cfg.Listen)
	if err != nil {
		a.log.Error("cannot listen for peers' checks; the verification graph will fail for this node",
			"listen", a.cfg.Listen, "error", err)
		return
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	a.log.Info("listening for peers' checks", "listen", ln.Addr().String())
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			a.log.Warn("accept a peer's check", "error", err)
			continue
		}
		go func() {
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(conn, "anneal-agent %s\n", a.name)
		}()
	}
}
