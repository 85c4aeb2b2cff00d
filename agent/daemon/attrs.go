package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/anneal-dev/anneal/agent/protocol"
	"github.com/anneal-dev/anneal/models/attrs"
)

// MaxAttrsBytes bounds the attributes a run may hand back.
const MaxAttrsBytes = 4 << 20

// attrsFiles are the two files of a run sent attributes: the attributes it
// is sent and the ones it hands back. Both paths are empty for other runs.
type attrsFiles struct {
	in, out string
}

// newAttrsFiles prepares item's two attributes files, as scratch files of
// its run; it does nothing for an item without Attrs.
func newAttrsFiles(item protocol.WorkItem, scratch *runScratch) (*attrsFiles, error) {
	if item.Attrs == nil {
		return &attrsFiles{}, nil
	}
	in, err := scratch.holding("attrs", ".json", item.Attrs, len(item.Redact) > 0)
	if err != nil {
		return nil, fmt.Errorf("cannot write attributes file: %v", err)
	}
	out, err := scratch.empty("attrs-out", ".json")
	if err != nil {
		return nil, fmt.Errorf("cannot create attributes answer file: %v", err)
	}
	return &attrsFiles{in: in, out: out}, nil
}

func (f *attrsFiles) environ() []string {
	if f.in == "" {
		return nil
	}
	return []string{"ANNEAL_ATTRS=" + f.in, "ANNEAL_ATTRS_OUT=" + f.out}
}

// read returns what the command handed back: the JSON object it wrote to
// the answer file deep-merged onto what it was sent (so a command adds or
// changes keys without copying the rest), or nil when it wrote nothing:
// the attributes are unchanged, and the report need not carry them back
// (for a graph task, every run's whole node data) for the API to decode,
// redact and store.
func (f *attrsFiles) read(sent json.RawMessage) (json.RawMessage, error) {
	if f.out == "" || leftEmpty(f.out) {
		return nil, nil
	}
	file, err := openFile(f.out, os.O_RDONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read $ANNEAL_ATTRS_OUT: %v", err)
	}
	defer file.Close()
	data, err := io.ReadAll(io.LimitReader(file, MaxAttrsBytes+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read $ANNEAL_ATTRS_OUT: %v", err)
	}
	if len(data) > MaxAttrsBytes {
		return nil, fmt.Errorf("$ANNEAL_ATTRS_OUT is larger than %d bytes", MaxAttrsBytes)
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, nil
	}
	var written, base map[string]any
	if err := json.Unmarshal(data, &written); err != nil || written == nil {
		return nil, fmt.Errorf("$ANNEAL_ATTRS_OUT must hold one JSON object: %s", truncate(string(data), 60))
	}
	if err := json.Unmarshal(sent, &base); err != nil {
		return nil, fmt.Errorf("attributes sent are not a JSON object: %v", err)
	}
	back, err := json.Marshal(attrs.DeepMerge(base, written))
	if err != nil {
		return nil, fmt.Errorf("encode attributes handed back: %v", err)
	}
	return back, nil
}
