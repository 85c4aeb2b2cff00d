package daemon

import (
	"encoding/json"
	"fmt"
	"os"
)

// CredentialFile is the name of the credential file inside the work directory.
const CredentialFile = "credential.json"

// Credential is the node's identity towards the API, stored in
// <WorkDir>/credential.json with mode 0600.
type Credential struct {
	NodeID int64  `json:"node_id"`
	Name   string `json:"name"`
	Token  string `json:"token"`
	APIURL string `json:"api_url"`
}

// LoadCredential reads a credential file. A missing file gives an error
// satisfying errors.Is(err, fs.ErrNotExist).
func LoadCredential(path string) (Credential, error) {
	var c Credential
	data, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("credential file %s is not valid JSON (%v): delete it and restart the agent with an enrollment token to re-enroll", path, err)
	}
	if c.Token == "" {
		return c, fmt.Errorf("credential file %s holds no token: delete it and restart the agent with an enrollment token to re-enroll", path)
	}
	return c, nil
}

// SaveCredential writes a credential file atomically with mode 0600.
func SaveCredential(path string, c Credential) error {
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	// CreateTemp makes the file 0600.
	if err := writeReplacing(path, ".credential-*.json", data, true); err != nil {
		return fmt.Errorf("saving credential: %w", err)
	}
	return nil
}
