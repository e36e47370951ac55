package recommendsvc

import (
	"context"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestServiceRejectsBadRequests: an unknown run and an out-of-range
// confidence are the caller's errors, told as such.
func TestServiceRejectsBadRequests(t *testing.T) {
	st, err := store.Open(t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	svc := NewService(st, aggregate.Pricing{}, nil)
	_, err = svc.DataloaderHistory(context.Background(), &trainmeterv1.DataloaderHistoryRequest{RunId: "nope"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("history of an unknown run: %v, want NotFound", err)
	}
	_, err = svc.Recommend(context.Background(), &trainmeterv1.RecommendRequest{MinConfidence: 2})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("min_confidence 2: %v, want InvalidArgument", err)
	}
	_, err = svc.Recommend(context.Background(), &trainmeterv1.RecommendRequest{RunIds: []string{"nope"}})
	if status.Code(err) != codes.NotFound {
		t.Errorf("recommend for an unknown run: %v, want NotFound", err)
	}
}
