package cost

import "time"

// SourceRepriced is the price source of GPU time whose price was set by
// `trainmeter reprice` after it was booked.
const SourceRepriced = "repriced"

// EnergyRate is how one joule of GPU energy consumed evenly over
// [start, end) is priced by the energy prices in force: add is called with
// each tariff band's part of the joule (flat: the band "flat") as the
// facility draws it (PUE × the GPUs' joules) and its USD. included: the GPU price includes
// energy (cloud rentals), which costs nothing extra (add is not called).
// ok is false when no energy price is configured. Energy is priced when it
// is booked (docs/costs.md, "Locked prices"): a window's energy cost is its
// joules times this rate.
func (c Config) EnergyRate(start, end time.Time, add func(band string, joules, usd float64)) (included, ok bool) {
	pue := c.EffectivePUE()
	switch {
	case c.EnergyIncluded:
		return true, true
	case c.Tariff != nil:
		t := c.Tariff
		t.Split(start, end, 1, func(b string, j float64) {
			p, known := t.Bands[b]
			if !known {
				b, p = t.Default, t.Bands[t.Default]
			}
			add(b, j*pue, j*pue/3.6e6*p)
		})
		return false, true
	case c.EnergyPricePerKWh > 0:
		add("flat", pue, pue/3.6e6*c.EnergyPricePerKWh)
		return false, true
	}
	return false, false
}
