package owner

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Proc reads what the sources need of a process from a procfs tree
// ("/proc", or a fixture in tests).
type Proc struct {
	Root string
}

// Stat is the part of /proc/PID/stat the sources use.
type Stat struct {
	Comm      string
	PPID      int
	PGID      int
	StartTime uint64 // clock ticks after boot
}

// Stat reads /proc/PID/stat. The command name is in parentheses and may
// itself hold spaces and ')', so the fields are counted from the last ')'.
func (p Proc) Stat(pid int) (Stat, error) {
	b, err := os.ReadFile(filepath.Join(p.Root, strconv.Itoa(pid), "stat"))
	if err != nil {
		return Stat{}, err
	}
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return Stat{}, fmt.Errorf("%d/stat: no command name", pid)
	}
	f := bytes.Fields(b[end+1:])
	// f[0] is field 3 (state): ppid is field 4, pgrp 5, starttime 22.
	if len(f) < 20 {
		return Stat{}, fmt.Errorf("%d/stat: too short", pid)
	}
	var s Stat
	s.Comm = string(b[open+1 : end])
	if s.PPID, err = strconv.Atoi(string(f[1])); err == nil {
		if s.PGID, err = strconv.Atoi(string(f[2])); err == nil {
			s.StartTime, err = strconv.ParseUint(string(f[19]), 10, 64)
		}
	}
	if err != nil {
		return Stat{}, fmt.Errorf("%d/stat: %v", pid, err)
	}
	return s, nil
}

// UID is the real uid of the process (/proc/PID/status "Uid:").
func (p Proc) UID(pid int) (int, error) {
	f, err := os.Open(filepath.Join(p.Root, strconv.Itoa(pid), "status"))
	if err != nil {
		return -1, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Uid:"); ok {
			if fs := strings.Fields(rest); len(fs) > 0 {
				return strconv.Atoi(fs[0])
			}
		}
	}
	return -1, fmt.Errorf("%d/status: no Uid line", pid)
}

// Cgroup is the process's cgroup paths, one per line of /proc/PID/cgroup
// (one line on cgroup v2, one per hierarchy on v1).
func (p Proc) Cgroup(pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(p.Root, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		// hierarchy-ID:controllers:path
		if parts := strings.SplitN(line, ":", 3); len(parts) == 3 {
			out = append(out, parts[2])
		}
	}
	return out, nil
}

// Environ is the process's environment (/proc/PID/environ), readable by
// the process's own user and root only.
func (p Proc) Environ(pid int) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(p.Root, strconv.Itoa(pid), "environ"))
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok && k != "" {
			env[k] = v
		}
	}
	return env, nil
}

// Alive reports whether the process exists.
func (p Proc) Alive(pid int) bool {
	_, err := os.Stat(filepath.Join(p.Root, strconv.Itoa(pid)))
	return err == nil
}

// containerID matches the container runtimes' cgroup path elements:
// docker-ID.scope, cri-containerd-ID.scope, crio-ID.scope, libpod-ID.scope,
// /docker/ID, /kubepods/.../ID (a 64-digit hex id).
var containerID = regexp.MustCompile(`(?:^|[/-])([0-9a-f]{64})(?:\.scope)?(?:/|$)`)

// ContainerID is the id of the container the process runs in, from its
// cgroup path; "" when none.
func ContainerID(cgroups []string) string {
	for _, c := range cgroups {
		if m := containerID.FindStringSubmatch(c); m != nil {
			return m[1]
		}
	}
	return ""
}
