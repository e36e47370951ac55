package prices

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
)

// DefaultAzureURL is Azure's retail prices API server (no key needed).
const DefaultAzureURL = "https://prices.azure.com"

// AzureGPUSize is what one Azure GPU VM size holds.
type AzureGPUSize struct {
	// GPUName is the GPU model, named so that CanonicalGPUName groups it
	// with the other providers' offers of that model.
	GPUName  string
	GPUs     int     // whole GPUs
	GPURAMGB float64 // of one GPU
}

// AzureGPUSizes maps the armSkuName of Azure's GPU VM sizes (NC, ND and NV
// series) with whole GPUs to their GPU model and count, from Azure's size
// documentation. Sizes with a fraction of a GPU (NVadsA10 v5 below
// NV36ads) cannot be priced per GPU and are left out, as are retired
// series. docs/budgets.md lists the table.
var AzureGPUSizes = map[string]AzureGPUSize{
	"Standard_NC6s_v3":           {"V100 PCIe", 1, 16},
	"Standard_NC12s_v3":          {"V100 PCIe", 2, 16},
	"Standard_NC24s_v3":          {"V100 PCIe", 4, 16},
	"Standard_NC24rs_v3":         {"V100 PCIe", 4, 16},
	"Standard_ND40rs_v2":         {"V100 SXM2", 8, 32},
	"Standard_NC4as_T4_v3":       {"T4", 1, 16},
	"Standard_NC8as_T4_v3":       {"T4", 1, 16},
	"Standard_NC16as_T4_v3":      {"T4", 1, 16},
	"Standard_NC64as_T4_v3":      {"T4", 4, 16},
	"Standard_NC24ads_A100_v4":   {"A100 PCIe", 1, 80},
	"Standard_NC48ads_A100_v4":   {"A100 PCIe", 2, 80},
	"Standard_NC96ads_A100_v4":   {"A100 PCIe", 4, 80},
	"Standard_ND96asr_v4":        {"A100 SXM4", 8, 40},
	"Standard_ND96amsr_A100_v4":  {"A100 SXM4", 8, 80},
	"Standard_NC40ads_H100_v5":   {"H100 NVL", 1, 94},
	"Standard_NC80adis_H100_v5":  {"H100 NVL", 2, 94},
	"Standard_ND96isr_H100_v5":   {"H100 SXM", 8, 80},
	"Standard_ND96isr_H200_v5":   {"H200 SXM", 8, 141},
	"Standard_ND96isr_MI300X_v5": {"MI300X", 8, 192},
	"Standard_NV36ads_A10_v5":    {"A10", 1, 24},
	"Standard_NV72ads_A10_v5":    {"A10", 2, 24},
}

// Azure fetches the list prices of Azure's GPU VM sizes (AzureGPUSizes)
// from the retail prices API, GET {BaseURL}/api/retail/prices?$filter=…
// ({"Items": [azureItem], "NextPageLink": URL or null}), following
// NextPageLink page after page (each page retried like any request). An
// item is an offer when its type is "Consumption", its unitOfMeasure
// "1 Hour", its productName not a Windows one (Windows prices include the
// licence) and its armSkuName in AzureGPUSizes; a skuName with "Spot" or
// "Low Priority" is spot. The offer is the VM's retailPrice for all its
// GPUs, in its armRegionName.
type Azure struct {
	BaseURL  string   // DefaultAzureURL if empty
	Regions  []string // if set, keeps to these armRegionNames ("eastus")
	MaxPages int      // bounds the pages followed; 0: 1000
	HTTPOptions
}

func (*Azure) Name() string { return "azure" }

// AzureFilter is the OData $filter the provider sends: Consumption prices
// of the VM sizes in AzureGPUSizes, in regions if any.
func AzureFilter(regions []string) string {
	skus := make([]string, 0, len(AzureGPUSizes))
	for k := range AzureGPUSizes {
		skus = append(skus, "armSkuName eq '"+k+"'")
	}
	sort.Strings(skus)
	f := "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and (" + strings.Join(skus, " or ") + ")"
	if len(regions) > 0 {
		rs := make([]string, len(regions))
		for i, r := range regions {
			rs[i] = "armRegionName eq '" + strings.ReplaceAll(r, "'", "''") + "'"
		}
		f += " and (" + strings.Join(rs, " or ") + ")"
	}
	return f
}

func (a *Azure) FetchOffers(ctx context.Context) ([]Offer, int, error) {
	base := cmp.Or(strings.TrimRight(a.BaseURL, "/"), DefaultAzureURL)
	baseURL, err := url.Parse(base)
	if err != nil {
		return nil, 0, fmt.Errorf("Azure retail prices: base URL %q: %w", base, err)
	}
	next := base + "/api/retail/prices?currencyCode=" + url.QueryEscape("'USD'") + "&$filter=" + url.QueryEscape(AzureFilter(a.Regions))
	maxPages := cmp.Or(a.MaxPages, 1000)
	var offers []Offer
	skipped := 0
	seen := map[string]bool{}
	for page := 1; next != ""; page++ {
		if page > maxPages {
			return nil, 0, fmt.Errorf("Azure retail prices: more than %d pages", maxPages)
		}
		u, err := url.Parse(next)
		if err != nil || !sameOrigin(u, baseURL) {
			// A link elsewhere is not followed: the answer is not the API's.
			return nil, 0, fmt.Errorf("Azure retail prices: page %d: NextPageLink %q is not on %s", page, next, base)
		}
		body, err := a.get(ctx, fmt.Sprintf("Azure retail prices from %s, page %d", base, page), http.MethodGet, next, "", nil)
		if err != nil {
			return nil, 0, err
		}
		got, bad, nextLink, err := ParseAzureRetailPage(body, a.Name())
		if err != nil {
			return nil, 0, fmt.Errorf("page %d: %w", page, err)
		}
		for _, o := range got {
			if !seen[o.ID] { // a page boundary moved while paging
				seen[o.ID] = true
				offers = append(offers, o)
			}
		}
		skipped += bad
		next = nextLink
	}
	return offers, skipped, nil
}

// sameOrigin: a and b name the same scheme, host and port (Azure's
// NextPageLink states ":443" where the base URL leaves it out).
func sameOrigin(a, b *url.URL) bool {
	port := func(u *url.URL) string {
		if p := u.Port(); p != "" {
			return p
		}
		switch strings.ToLower(u.Scheme) {
		case "https":
			return "443"
		case "http":
			return "80"
		}
		return ""
	}
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Hostname(), b.Hostname()) && port(a) == port(b)
}

type azureItem struct {
	ArmSkuName    string  `json:"armSkuName"`
	ArmRegionName string  `json:"armRegionName"`
	RetailPrice   float64 `json:"retailPrice"` // null: 0, not priced
	UnitOfMeasure string  `json:"unitOfMeasure"`
	SkuName       string  `json:"skuName"`
	ProductName   string  `json:"productName"`
	Type          string  `json:"type"`
}

// ParseAzureRetailPage decodes one page of Azure's retail prices answer
// (see Azure): the GPU VM offers on it, how many GPU VM items it skipped
// (a field of the wrong type, no positive price, no region), and the next
// page's link ("" on the last page). Items of other sizes, Windows prices,
// reservations and units other than "1 Hour" are not offers and not
// counted. A page without an "Items" array is an error.
func ParseAzureRetailPage(body []byte, provider string) (offers []Offer, skipped int, next string, err error) {
	var doc struct {
		Items        *[]json.RawMessage `json:"Items"`
		NextPageLink string             `json:"NextPageLink"` // null on the last page
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, 0, "", fmt.Errorf("Azure retail prices: %w", err)
	}
	if doc.Items == nil {
		return nil, 0, "", errors.New(`Azure retail prices: no "Items" array`)
	}
	for _, raw := range *doc.Items {
		var it azureItem
		if err := json.Unmarshal(raw, &it); err != nil {
			skipped++
			continue
		}
		size, ok := AzureGPUSizes[it.ArmSkuName]
		if !ok || !strings.EqualFold(it.Type, "Consumption") || it.UnitOfMeasure != "1 Hour" || strings.Contains(it.ProductName, "Windows") {
			continue
		}
		spot := strings.Contains(it.SkuName, "Spot") || strings.Contains(it.SkuName, "Low Priority")
		o := Offer{ID: it.ArmSkuName + "@" + it.ArmRegionName, Provider: provider, GPUName: size.GPUName, NumGPUs: size.GPUs,
			GPURAMGB: size.GPURAMGB, USDPerHour: it.RetailPrice, Location: it.ArmRegionName, Spot: spot}
		switch {
		case strings.Contains(it.SkuName, "Low Priority"):
			o.ID += " low priority"
		case spot:
			o.ID += " spot"
		}
		if o.Validate() != nil || strings.TrimSpace(it.ArmRegionName) == "" {
			skipped++
			continue
		}
		offers = append(offers, o)
	}
	return offers, skipped, strings.TrimSpace(doc.NextPageLink), nil
}
