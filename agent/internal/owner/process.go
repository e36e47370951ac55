package owner

import (
	"fmt"
	"regexp"
)

// ProcessOwner is the owner of a process that no run, job or pod owns: its
// Linux user and process group (a shell's job: torchrun and its ranks, a
// pipeline, a script and its children share one), as one run. The run id
// names the node, uid, process group and the group leader's start time, so
// a reused process-group id is another run and a restarted agent finds the
// same one again.
func ProcessOwner(p Proc, node string, pid int) (Owner, error) {
	st, err := p.Stat(pid)
	if err != nil {
		return Owner{}, err
	}
	uid, err := p.UID(pid)
	if err != nil {
		return Owner{}, err
	}
	start := st.StartTime
	if st.PGID > 0 && st.PGID != pid {
		if lead, err := p.Stat(st.PGID); err == nil {
			start = lead.StartTime
		}
	}
	o := Owner{
		Source: AttrProcess,
		RunID:  fmt.Sprintf("proc-%s-%d-%d-%d", sanitize(node), uid, st.PGID, start),
		UID:    uid,
		Labels: map[string]string{"process.command": st.Comm},
	}
	if cg, err := p.Cgroup(pid); err == nil {
		if id := ContainerID(cg); id != "" {
			o.Labels["container.id"] = id
		}
	}
	return o, nil
}

var unsafeID = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// sanitize keeps a name usable in a run id (letters, digits, . _ -).
func sanitize(s string) string {
	if s = unsafeID.ReplaceAllString(s, "_"); s == "" {
		return "_"
	}
	return s
}
