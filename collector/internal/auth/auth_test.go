package auth

import (
	"testing"

	"google.golang.org/grpc"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Every RPC of our services must have a role: a method missing from the
// table is refused on a collector with tokens, so adding an RPC without
// deciding who may call it fails here first.
func TestEveryRPCHasARole(t *testing.T) {
	for _, sd := range []grpc.ServiceDesc{trainmeterv1.IngestService_ServiceDesc, trainmeterv1.QueryService_ServiceDesc, trainmeterv1.BudgetService_ServiceDesc, trainmeterv1.PriceService_ServiceDesc} {
		var names []string
		for _, m := range sd.Methods {
			names = append(names, m.MethodName)
		}
		for _, s := range sd.Streams {
			names = append(names, s.StreamName)
		}
		for _, n := range names {
			full := "/" + sd.ServiceName + "/" + n
			if _, ok := methodRoles[full]; !ok {
				t.Errorf("%s has no role in methodRoles", full)
			}
		}
	}
	if r, _ := RoleOf(trainmeterv1.QueryService_DeleteRun_FullMethodName); r != RoleAdmin {
		t.Errorf("DeleteRun role %v, want admin", r)
	}
	for _, m := range []string{"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"} {
		if r, ok := RoleOf(m); !ok || r != RoleOpen {
			t.Errorf("%s: role %v known %v, want open", m, r, ok)
		}
	}
	if _, ok := RoleOf("/trainmeter.v1.QueryService/SomethingNew"); ok {
		t.Error("an unknown method has a role")
	}
}
