package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/anneal-dev/anneal/models/secrets"
)

// devSecretKeyFile is where `dev up` keeps the installation's secret key,
// under its state directory (created once, mode 0600).
const devSecretKeyFile = "secret.key"

// DefaultCodecProxyPort is where `dev up` serves the Web UI's codec
// endpoint (--ui-codec-endpoint of the dev server).
const DefaultCodecProxyPort = 8234

// ensureSecretKey returns the path of the dev secret key, generating it
// on first use.
func ensureSecretKey(state string) (string, error) {
	p := filepath.Join(state, devSecretKeyFile)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	body := "# anneal's secret keys (base64, the first one encrypts); written by `go run ./dev up`\n" + secrets.GenerateKey() + "\n"
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		return "", fmt.Errorf("write the dev secret key: %w", err)
	}
	return p, nil
}

// serveCodecProxy serves the Temporal Web UI's codec endpoint on addr
// until ctx ends: it answers the browser's CORS preflight for uiOrigin and
// forwards POST /encode and /decode to the API's codec server with token,
// since the dev Web UI has no login whose token the API would accept.
// It listens on 127.0.0.1 only.
func serveCodecProxy(ctx context.Context, addr, apiURL, token, uiOrigin string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("codec proxy: %w", err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", uiOrigin)
		w.Header().Set("Access-Control-Allow-Credentials", "true")
		w.Header().Set("Access-Control-Allow-Headers", "Content-Type, X-Namespace, Authorization")
		w.Header().Set("Access-Control-Allow-Methods", "POST, OPTIONS")
		if r.Method == http.MethodOptions {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		op := strings.TrimPrefix(r.URL.Path, "/")
		if r.Method != http.MethodPost || (op != "encode" && op != "decode") {
			http.NotFound(w, r)
			return
		}
		req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, apiURL+"/api/v1/codec/"+op, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "codec proxy:", err)
		}
	}()
	return nil
}
