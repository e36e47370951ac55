package agent

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// raiseSamplingPriority puts the calling thread (the sampling loop's, locked
// to it) under SCHED_RR at cfg.SamplePriority. Only this thread: the socket
// parser, the uplink and everything a trainer can drive stay at normal
// priority, so a flooding client can never borrow real-time CPU time.
func (a *Agent) raiseSamplingPriority() {
	prio := a.cfg.SamplePriority
	if prio == 0 {
		a.self.setScheduling("normal (own thread)")
		return
	}
	attr := &unix.SchedAttr{Policy: unix.SCHED_RR, Priority: uint32(prio), Flags: unix.SCHED_FLAG_RESET_ON_FORK}
	if err := unix.SchedSetAttr(0, attr, 0); err != nil {
		why := fmt.Sprintf("SCHED_RR %d refused: %v", prio, err)
		a.self.setScheduling("normal (own thread): " + why)
		a.log.Info("sampling thread at normal priority: its ticks may come late while the CPUs are saturated; "+
			"allow real-time scheduling (systemd: LimitRTPRIO=, as deploy/systemd/trainmeter-agent.service does) or set --sample-priority 0",
			"err", why)
		return
	}
	a.self.setScheduling(fmt.Sprintf("SCHED_RR %d (own thread)", prio))
	a.log.Debug("sampling thread under SCHED_RR", "priority", prio)
}
