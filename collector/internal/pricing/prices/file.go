package prices

import (
	"bytes"
	"cmp"
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// File reads offers from a price list, re-read at every fetch: JSON in
// vast.ai's offers format ({"offers": [...]} or a bare array), or CSV with
// a header row naming at least gpu_name and a price column (dph_total or
// usd_per_hour: the offer's total $/h; or usd_per_gpu_hour), and
// optionally num_gpus (default 1), gpu_ram (MB), reliability,
// dlperf_per_dphtotal, inet_down, geolocation (or region), id, provider,
// spot (true/false, or the pricing: spot/on-demand; default on-demand).
type File struct {
	Path string
}

func (*File) Name() string { return "file" }

// FetchOffers implements Provider; a list skips nothing (a row that
// cannot be priced is an error).
func (f *File) FetchOffers(context.Context) ([]Offer, int, error) {
	b, err := os.ReadFile(f.Path)
	if err != nil {
		return nil, 0, fmt.Errorf("price file: %w", err)
	}
	offers, err := ParsePriceList(b, f.Name())
	if err != nil {
		return nil, 0, fmt.Errorf("price file %s: %w", f.Path, err)
	}
	return offers, 0, nil
}

// ParsePriceList parses a JSON or CSV price list (see File). Unlike the
// vast.ai answer, a list is hand-made: a row that cannot be priced is an
// error that names it.
func ParsePriceList(b []byte, provider string) ([]Offer, error) {
	t := bytes.TrimSpace(b)
	if len(t) > 0 && (t[0] == '{' || t[0] == '[') {
		offers, skipped, err := ParseVastAIOffers(bytes.NewReader(t), provider)
		if err != nil {
			return nil, err
		}
		if skipped > 0 {
			return nil, fmt.Errorf("%d offer(s) without a gpu_name, a whole num_gpus >= 1 or a positive dph_total", skipped)
		}
		return offers, nil
	}
	return parseCSV(b, provider)
}

func parseCSV(b []byte, provider string) ([]Offer, error) {
	r := csv.NewReader(bytes.NewReader(b))
	r.TrimLeadingSpace = true
	r.Comment = '#'
	header, err := r.Read()
	if err == io.EOF {
		return nil, fmt.Errorf("empty price list")
	}
	if err != nil {
		return nil, err
	}
	col := map[string]int{}
	for i, h := range header {
		col[strings.ToLower(strings.TrimSpace(h))] = i
	}
	if _, ok := col["gpu_name"]; !ok {
		return nil, fmt.Errorf("CSV header %q has no gpu_name column", strings.Join(header, ","))
	}
	priceCol := ""
	for _, c := range []string{"dph_total", "usd_per_hour", "usd_per_gpu_hour"} {
		if _, ok := col[c]; ok && priceCol == "" {
			priceCol = c
		}
	}
	perGPU := priceCol == "usd_per_gpu_hour"
	if priceCol == "" {
		return nil, fmt.Errorf("CSV header %q has no price column (dph_total, usd_per_hour or usd_per_gpu_hour)", strings.Join(header, ","))
	}
	var out []Offer
	for line := 2; ; line++ {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		get := func(name string) string {
			if i, ok := col[name]; ok && i < len(rec) {
				return strings.TrimSpace(rec[i])
			}
			return ""
		}
		num := func(name string, def float64) (float64, error) {
			s := get(name)
			if s == "" {
				return def, nil
			}
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return 0, fmt.Errorf("line %d: %s %q is not a number", line, name, s)
			}
			return v, nil
		}
		o := Offer{ID: cmp.Or(get("id"), fmt.Sprintf("line-%d", line)), Provider: cmp.Or(get("provider"), provider), GPUName: get("gpu_name"),
			Location: cmp.Or(get("geolocation"), get("region"))}
		switch strings.ToLower(get("spot")) {
		case "", "false", "0", "no", "on-demand":
		case "true", "1", "yes", "spot":
			o.Spot = true
		default:
			return nil, fmt.Errorf("line %d: spot %q: want true or false", line, get("spot"))
		}
		var n, price, ram, rel float64
		if n, err = num("num_gpus", 1); err != nil {
			return nil, err
		}
		if n != math.Trunc(n) || n < 1 || n > math.MaxInt32 {
			return nil, fmt.Errorf("line %d: num_gpus %q is not a whole number of GPUs >= 1", line, get("num_gpus"))
		}
		for _, f := range []struct {
			name string
			dst  *float64
		}{{priceCol, &price}, {"gpu_ram", &ram}, {"reliability", &rel}, {"dlperf_per_dphtotal", &o.DLPerfPerUSD}, {"inet_down", &o.InetDownMbps}} {
			if *f.dst, err = num(f.name, 0); err != nil {
				return nil, err
			}
		}
		if get("reliability") != "" {
			o.Reliability = &rel
		}
		o.NumGPUs, o.GPURAMGB, o.USDPerHour = int(n), ram/1024, price
		if perGPU {
			o.USDPerHour = price * n
		}
		if err := o.Validate(); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		out = append(out, o)
	}
	return out, nil
}
