package cli

import (
	"cmp"
	"context"
	"slices"

	"github.com/trainmeter/trainmeter/collector/internal/page"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// allRuns is every run, read from ListRuns a page at a time (a list of
// many runs is larger than one gRPC message may be), oldest first: by
// start, then run id.
func allRuns(ctx context.Context, c trainmeterv1.QueryServiceClient) ([]*trainmeterv1.RunReport, error) {
	runs, err := page.All(func(tok string) ([]*trainmeterv1.RunReport, string, error) {
		resp, err := c.ListRuns(ctx, &trainmeterv1.ListRunsRequest{PageToken: tok})
		return resp.GetRuns(), resp.GetNextPageToken(), err
	})
	slices.SortStableFunc(runs, func(a, b *trainmeterv1.RunReport) int {
		return cmp.Or(a.GetStart().AsTime().Compare(b.GetStart().AsTime()), cmp.Compare(a.GetRunId(), b.GetRunId()))
	})
	return runs, err
}

// allNodes is every node, read from ListNodes a page at a time, by name.
func allNodes(ctx context.Context, c trainmeterv1.QueryServiceClient) ([]*trainmeterv1.NodeStatus, error) {
	return page.All(func(tok string) ([]*trainmeterv1.NodeStatus, string, error) {
		resp, err := c.ListNodes(ctx, &trainmeterv1.ListNodesRequest{PageToken: tok})
		return resp.GetNodes(), resp.GetNextPageToken(), err
	})
}

// allAlerts is every alert of kind ("": all), read from ListAlerts a page
// at a time, oldest first.
func allAlerts(ctx context.Context, c trainmeterv1.BudgetServiceClient, kind string) ([]*trainmeterv1.Alert, error) {
	return page.All(func(tok string) ([]*trainmeterv1.Alert, string, error) {
		resp, err := c.ListAlerts(ctx, &trainmeterv1.ListAlertsRequest{Kind: kind, PageToken: tok})
		return resp.GetAlerts(), resp.GetNextPageToken(), err
	})
}
