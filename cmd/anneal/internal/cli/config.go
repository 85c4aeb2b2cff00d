package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Environment variables the CLI reads; they override the config file and
// are overridden by --url and --token.
const (
	EnvURL   = "ANNEAL_URL"
	EnvToken = "ANNEAL_TOKEN"
)

// Config is where the API is and the bearer token to call it with, as
// `anneal login` stores it.
type Config struct {
	URL   string `json:"url"`
	Token string `json:"token"`
}

// ConfigPath is the config file: $XDG_CONFIG_HOME/anneal/config.json (or
// the platform's user config directory when XDG_CONFIG_HOME is unset).
func ConfigPath() (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("find the user config directory: %w", err)
	}
	return filepath.Join(dir, "anneal", "config.json"), nil
}

// LoadConfig reads the config file; a missing file is an empty config.
func LoadConfig(path string) (Config, error) {
	var c Config
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("read config %s: %w", path, err)
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, fmt.Errorf("config %s is not valid JSON (fix or remove it, or run `anneal login`): %w", path, err)
	}
	return c, nil
}

// SaveConfig writes the config file with mode 0600 (it holds a token),
// creating its directory, and replaces an older file atomically.
func SaveConfig(path string, c Config) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("create config directory: %w", err)
	}
	raw, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("encode config: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".config-*.json")
	if err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename this is a no-op
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("write config: %w", err)
	}
	if _, err := tmp.Write(append(raw, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("write config: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	return nil
}

// resolve layers the sources: file, then environment, then flags.
func resolve(file Config, getenv func(string) string, flagURL, flagToken string) Config {
	c := file
	if v := getenv(EnvURL); v != "" {
		c.URL = v
	}
	if v := getenv(EnvToken); v != "" {
		c.Token = v
	}
	if flagURL != "" {
		c.URL = flagURL
	}
	if flagToken != "" {
		c.Token = flagToken
	}
	c.URL = strings.TrimRight(c.URL, "/")
	return c
}
