package prices

import (
	"math"
	"os"
	"strings"
	"testing"
)

// FuzzParsePriceList feeds arbitrary --price-file contents (JSON or CSV)
// to the parser. It must never panic, and every offer it returns must be
// one the rest of the collector can price: valid, with a finite positive
// price per GPU-hour and finite, non-negative figures.
func FuzzParsePriceList(f *testing.F) {
	b, err := os.ReadFile("testdata/price_list.csv")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	// One vast.ai offer, not the whole testdata answer: minimising a 5 KB
	// input stalls a 5 s fuzz run.
	f.Add([]byte(`{"offers":[{"id":1,"gpu_name":"RTX 4090","num_gpus":2,"gpu_ram":24564,"dph_total":0.8,` +
		`"reliability2":0.99,"dlperf_per_dphtotal":170,"inet_down":900,"geolocation":"Texas, US"}]}`))
	f.Add([]byte("gpu_name,usd_per_gpu_hour,num_gpus\nH100,2.5,8\n"))
	f.Add([]byte("gpu_name,dph_total\nA100,-1\n"))
	f.Add([]byte("gpu_name,dph_total,num_gpus\nA100,1,1.5\n"))
	f.Add([]byte(`[{"gpu_name":"A100","num_gpus":1,"dph_total":1e400}]`))
	f.Add([]byte(`{"offers":[{"gpu_name":"","num_gpus":0}]}`))
	f.Add([]byte(""))
	// Found by this target: gpu_ram NaN and a negative inet_down were kept.
	f.Add([]byte("gpu_name,dph_total,gpu_ram\nA100,1,NaN\n"))
	f.Add([]byte("gpu_name,dph_total,inet_down\nA100,1,-5\n"))
	f.Add([]byte(`[{"gpu_name":"A100","num_gpus":1,"dph_total":1,"gpu_ram":-1}]`))
	f.Fuzz(func(t *testing.T, list []byte) {
		offers, err := ParsePriceList(list, "file")
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("empty error")
			}
			return
		}
		for _, o := range offers {
			if err := o.Validate(); err != nil {
				t.Fatalf("returned an invalid offer: %v", err)
			}
			if p := o.PerGPUHour(); !(p > 0) || math.IsInf(p, 0) {
				t.Fatalf("offer %q: %v $/GPU-hour", o.ID, p)
			}
			if r := o.Reliability; r != nil && !(*r >= 0 && *r <= 1) {
				t.Fatalf("offer %q: reliability %v", o.ID, *r)
			}
			for name, v := range map[string]float64{"gpu_ram_gb": o.GPURAMGB,
				"dlperf_per_usd": o.DLPerfPerUSD, "inet_down_mbps": o.InetDownMbps} {
				if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
					t.Fatalf("offer %q: %s = %v", o.ID, name, v)
				}
			}
			if o.Provider == "" {
				t.Fatalf("offer %q has no provider", o.ID)
			}
		}
	})
}

// FuzzProviderAnswers feeds arbitrary bytes, as a provider's API might
// answer, to the Lambda, RunPod and Azure parsers. None may panic; each
// returns an error or offers that pass Validate, with its provider, and a
// skipped count >= 0.
func FuzzProviderAnswers(f *testing.F) {
	for _, name := range []string{"lambda_instance_types.json", "runpod_gpu_types.json", "azure_page1.json", "azure_page2.json"} {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"data":{"x":{"instance_type":{"price_cents_per_hour":1e308,"specs":{"gpus":1e-9}}}}}`))
	f.Add([]byte(`{"data":{"gpuTypes":[{"displayName":"H100","securePrice":-1,"lowestPrice":{"stockStatus":"High"}}]}}`))
	f.Add([]byte(`{"Items":[{"armSkuName":"Standard_NC6s_v3","retailPrice":1e400,"unitOfMeasure":"1 Hour","type":"Consumption","armRegionName":"x"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		check := func(parser, provider string, offers []Offer, skipped int, err error) {
			if err != nil {
				if strings.TrimSpace(err.Error()) == "" {
					t.Fatalf("%s: empty error", parser)
				}
				return
			}
			if skipped < 0 {
				t.Fatalf("%s: skipped %d", parser, skipped)
			}
			for _, o := range offers {
				if err := o.Validate(); err != nil {
					t.Fatalf("%s returned an invalid offer: %v", parser, err)
				}
				if p := o.PerGPUHour(); !(p > 0) || math.IsInf(p, 0) || o.Provider != provider {
					t.Fatalf("%s: offer %+v", parser, o)
				}
			}
		}
		offers, skipped, err := ParseLambdaInstanceTypes(body, "lambda")
		check("lambda", "lambda", offers, skipped, err)
		offers, skipped, err = ParseRunPodGPUTypes(body, "runpod")
		check("runpod", "runpod", offers, skipped, err)
		offers, skipped, _, err = ParseAzureRetailPage(body, "azure")
		check("azure", "azure", offers, skipped, err)
	})
}
