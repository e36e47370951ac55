package doctor

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainersock"
)

// pingLine is what the socket probe sends: an event the agent does not know,
// which it answers with an error line and otherwise ignores.
const pingLine = `{"event":"doctor_ping"}` + "\n"

func checkSocket(ctx context.Context, o Options, r *Report) {
	path := o.Config.Socket
	if path == "" {
		return // config already failed
	}
	dir := filepath.Dir(path)
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, derr := os.Stat(dir); errors.Is(derr, fs.ErrNotExist) {
			r.add(SectionSocket, "path", Fail, fmt.Sprintf("no socket at %s, and its directory %s does not exist", path, dir),
				fmt.Sprintf("the agent creates the socket but not its directory: sudo mkdir -p %s (the systemd unit's RuntimeDirectory= does it), then start the agent", dir))
			return
		}
		r.add(SectionSocket, "path", Fail, fmt.Sprintf("no socket at %s: the agent is not running, or it listens elsewhere", path),
			"start the agent (sudo systemctl start trainmeter-agent), or give doctor the agent's own --socket / --config")
		return
	case errors.Is(err, fs.ErrPermission):
		r.add(SectionSocket, "path", Fail, fmt.Sprintf("cannot look into %s (%s): permission denied", dir, describeOwner(dir)),
			"trainers must be able to enter the socket's directory: add their user to its group (sudo usermod -aG GROUP USER, then log in again)")
		return
	case err != nil:
		r.add(SectionSocket, "path", Fail, err.Error(), "")
		return
	case fi.Mode().Type() != fs.ModeSocket:
		r.add(SectionSocket, "path", Fail, fmt.Sprintf("%s exists but is not a socket (%v)", path, fi.Mode()),
			"the agent will not replace it: remove it, or choose another --socket")
		return
	}
	uid, gid := ownerOf(fi)
	r.add(SectionSocket, "path", OK, fmt.Sprintf("%s is a socket, %s", path, describeFile(fi)), "")

	checkAccess(o, r, fi, uid, gid)
	checkConnect(ctx, o, r, path)
}

// checkAccess says who may connect, and whether this process may.
func checkAccess(o Options, r *Report, fi fs.FileInfo, uid, gid int) {
	mode := fi.Mode().Perm()
	var who []string
	if mode&0o002 != 0 {
		who = append(who, "every user (the socket is world-writable)")
	} else {
		if mode&0o200 != 0 {
			who = append(who, "its owner "+userName(uid))
		}
		if mode&0o020 != 0 {
			who = append(who, "members of group "+groupName(gid))
		}
		who = append(who, "root")
	}
	msg := "who may connect: " + strings.Join(who, ", ")
	if len(o.Config.AllowedUIDs) > 0 {
		var names []string
		for _, u := range o.Config.AllowedUIDs {
			names = append(names, userName(int(u)))
		}
		msg += "; of those the agent admits only root and " + strings.Join(names, ", ") + " (allowed_uids)"
	}
	st, hint := OK, ""
	var notes []string
	warn := func(note, h string) { st, hint, notes = Warn, h, append(notes, note) }
	if o.Config.SocketGroup != "" {
		g, err := user.LookupGroup(o.Config.SocketGroup)
		switch {
		case err != nil:
			warn(fmt.Sprintf("socket_group %q does not exist here", o.Config.SocketGroup),
				"create it (sudo groupadd --system "+o.Config.SocketGroup+") and add the trainers' users to it; the agent refuses to start without it")
		case g.Gid != strconv.Itoa(gid):
			warn(fmt.Sprintf("the configuration says socket_group %s, but the socket's group is %s", o.Config.SocketGroup, groupName(gid)),
				"the running agent was started with another --socket-group (or none); restart it with this configuration")
		}
	} else if gid >= 0 {
		if _, err := user.LookupGroupId(strconv.Itoa(gid)); err != nil {
			notes = append(notes, fmt.Sprintf("group id %d has no name on this machine", gid))
		}
	}

	// This process: the kernel's check on connect(2) is write permission.
	euid := os.Geteuid()
	me := userName(euid)
	can := euid == 0 || mode&0o002 != 0 || (euid == uid && mode&0o200 != 0) || (inGroup(gid) && mode&0o020 != 0)
	if !can && st == OK {
		h := "start the agent with --socket-group GROUP (socket mode 0660) and add the trainers' users to GROUP"
		if u, err := user.Current(); err == nil && mode&0o020 != 0 {
			h = fmt.Sprintf("trainers must run as a member of group %s: sudo usermod -aG %s %s, then log in again", groupName(gid), groupName(gid), u.Username)
			if ids, _ := u.GroupIds(); slices.Contains(ids, strconv.Itoa(gid)) {
				h = fmt.Sprintf("you were added to group %s after logging in: log out and back in (or run newgrp %s)", groupName(gid), groupName(gid))
			}
		}
		warn(fmt.Sprintf("you (%s) may not connect", me), h)
	}
	if len(o.Config.AllowedUIDs) > 0 && euid != 0 && !slices.Contains(o.Config.AllowedUIDs, uint32(euid)) && st == OK {
		warn(fmt.Sprintf("you (%s, uid %d) are not in allowed_uids", me, euid),
			fmt.Sprintf("the agent refuses uids not in allowed_uids: add %d (--allow-uid %d) if this user runs trainers", euid, euid))
	}
	if len(notes) > 0 {
		msg += "; " + strings.Join(notes, "; ")
	}
	r.add(SectionSocket, "access", st, msg, hint)
}

// checkConnect connects, sends an unknown event and reads the agent's answer.
func checkConnect(ctx context.Context, o Options, r *Report, path string) {
	d := net.Dialer{Timeout: o.Timeout}
	c, err := d.DialContext(ctx, "unix", path)
	switch {
	case errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM):
		r.add(SectionSocket, "connect", Fail, fmt.Sprintf("permission denied connecting to %s as %s", path, userName(os.Geteuid())),
			"see the access line above: trainers need write permission on the socket (owner, or member of its group)")
		return
	case errors.Is(err, syscall.ECONNREFUSED):
		r.add(SectionSocket, "connect", Fail, fmt.Sprintf("nobody accepts connections on %s: a socket left by an agent that is no longer running", path),
			"start the agent (it replaces the stale socket): sudo systemctl start trainmeter-agent; journalctl -u trainmeter-agent says why it stopped")
		return
	case err != nil:
		r.add(SectionSocket, "connect", Fail, "cannot connect: "+err.Error(), "")
		return
	}
	defer c.Close()
	peer := peerInfo(c)
	_ = c.SetDeadline(time.Now().Add(o.Timeout))
	// A write error is not the end: an agent that refuses this uid writes
	// its reason and closes, possibly before the ping goes out.
	_, werr := c.Write([]byte(pingLine))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && line == "" {
		var ne net.Error
		if werr == nil && errors.As(err, &ne) && ne.Timeout() {
			r.add(SectionSocket, "connect", Warn, fmt.Sprintf("connected%s, but no answer in %v", peer, o.Timeout),
				"the agent may be overloaded or stuck; its log and --status-listen /status tell more")
			return
		}
		r.add(SectionSocket, "connect", Fail, fmt.Sprintf("connected%s, but the connection closed without an answer: %v", peer, cmp.Or(werr, err)), "")
		return
	}
	var ans struct {
		Event string `json:"event"`
		Error string `json:"error"`
	}
	_ = json.Unmarshal([]byte(line), &ans)
	switch {
	case ans.Event == "error" && strings.Contains(ans.Error, "is not allowed"):
		r.add(SectionSocket, "connect", Fail, fmt.Sprintf("the agent%s refused this user: %s", peer, ans.Error),
			"the agent admits only root and the uids in allowed_uids (--allow-uid): add the trainers' uids there")
	case ans.Event == "error" && strings.Contains(ans.Error, "too many connections"):
		r.add(SectionSocket, "connect", Fail, fmt.Sprintf("the agent%s refused the connection: %s", peer, ans.Error), "")
	case ans.Event == "error":
		r.add(SectionSocket, "connect", OK, fmt.Sprintf("a running agent%s answered (trainers can report here)", peer), "")
	default:
		r.add(SectionSocket, "connect", Warn, fmt.Sprintf("something%s answered, but not like a trainmeter agent: %q", peer, strings.TrimSpace(line)),
			"is another program listening on this path?")
	}
}

// peerInfo names the process on the other end of a Unix socket (SO_PEERCRED:
// the agent that listens), as " (pid N, user U)", or "" when unknown.
func peerInfo(c net.Conn) string {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ""
	}
	pid, uid, _, err := trainersock.PeerCred(uc)
	if err != nil {
		return ""
	}
	return fmt.Sprintf(" (pid %d, user %s)", pid, userName(int(uid)))
}

// inGroup reports whether this process has gid among its groups.
func inGroup(gid int) bool {
	if gid < 0 {
		return false
	}
	if os.Getegid() == gid {
		return true
	}
	gs, _ := os.Getgroups()
	return slices.Contains(gs, gid)
}

func userName(uid int) string {
	if uid < 0 {
		return "?"
	}
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return fmt.Sprintf("%s (%d)", u.Username, uid)
	}
	return strconv.Itoa(uid)
}

func groupName(gid int) string {
	if gid < 0 {
		return "?"
	}
	if g, err := user.LookupGroupId(strconv.Itoa(gid)); err == nil {
		return g.Name
	}
	return strconv.Itoa(gid)
}

func describeOwner(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return err.Error()
	}
	return describeFile(fi)
}

// describeFile is "mode 0660, owner root (0), group trainmeter".
func describeFile(fi fs.FileInfo) string {
	uid, gid := ownerOf(fi)
	return fmt.Sprintf("mode %04o, owner %s, group %s", fi.Mode().Perm(), userName(uid), groupName(gid))
}
