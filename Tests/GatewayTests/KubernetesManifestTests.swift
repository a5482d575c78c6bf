import Foundation
import GatewayConfig
import Testing
import TestSupport

/// `deploy/kubernetes` (issue 28 §4): valid against the Kubernetes API schemas, with a gateway
/// configuration that loads, and the forward-auth Ingress passing on every identity header.
@Suite("Kubernetes manifests", .serialized, .timeLimit(.minutes(3)))
struct KubernetesManifestTests {
    static let directory = "\(repositoryRoot)/deploy/kubernetes"

    @Test("every manifest validates against the Kubernetes 1.30 schemas, strictly (no unknown fields)")
    func schemas() async throws {
        let (status, output) = try await blocking { runCapturingOutput("/bin/sh", ["-c", "cd \(repositoryRoot) && scripts/validate-kubernetes.sh"]) }
        #expect(status == 0, "\(output)")
        for resource in ["configmap/sessiongate", "deployment/sessiongate", "poddisruptionbudget/sessiongate", "service/sessiongate",
                         "secret/sessiongate-secrets", "ingress/legacy-app", "ingress/sessiongate-endpoints"] {
            #expect(output.contains("passed for resource \(resource) "), "\(resource): \(output)")
        }
    }

    @Test("the ConfigMap's configuration loads without a problem, with the admin listener reachable by the probes")
    func configuration() throws {
        let map = try String(contentsOfFile: Self.directory + "/configmap.yaml", encoding: .utf8)
        let lines = map.split(separator: "\n", omittingEmptySubsequences: false)
        let start = try #require(lines.firstIndex { $0.hasPrefix("  sessiongate.yaml: |") })
        let body = lines[(start + 1)...].prefix { $0.isEmpty || $0.hasPrefix("    ") }.map { $0.dropFirst(min(4, $0.count)) }.joined(separator: "\n")
        let result = GatewayConfiguration.parse(yaml: body)
        // The one warning is the point here: the admin listener on the pod's address.
        #expect(result.problems.map(\.path) == ["server.admin_listen"] && result.errors.isEmpty, "\(result.problems)")
        let c = try #require(result.configuration)
        #expect(c.server.adminListen.host == "0.0.0.0" && c.server.adminListen.port == 9091, "the kubelet probes the pod's address")
        #expect(c.store.redisURL != nil, "replicas share sessions only through Redis")
        let deployment = try String(contentsOfFile: Self.directory + "/deployment.yaml", encoding: .utf8)
        let state = try #require(c.store.stateDir, "held revocations survive a container restart")
        #expect(deployment.contains("mountPath: \(state)\n"), "store.state_dir is a writable volume (the root file system is read-only)")
        for line in ["path: /healthz", "path: /readyz", "containerPort: 9091", "containerPort: 8080", "runAsUser: 10001", "readOnlyRootFilesystem: true",
                     "mountPath: /etc/sessiongate/sessiongate.yaml", "mountPath: /etc/sessiongate/secrets", "kind: PodDisruptionBudget"] {
            #expect(deployment.contains(line), "\(line)")
        }
        for path in [c.apple?.privateKeyFile.description ?? "", c.session.secretFile?.description ?? ""] {
            #expect(path.contains("/etc/sessiongate/secrets/"), "the secrets come from the Secret's mount: \(path)")
        }
    }

    @Test("the ingress-nginx example passes every identity header on, and routes /_auth/ to the gateway")
    func forwardAuthIngress() throws {
        let ingress = try String(contentsOfFile: Self.directory + "/ingress-nginx-auth-url.yaml", encoding: .utf8)
        let line = try #require(ingress.split(separator: "\n").first { $0.contains("auth-response-headers:") })
        let listed = Set(line.split(separator: "\"")[1].split(separator: ",").map(String.init))
        #expect(listed == Set(IdentityHeaderNames().all))
        #expect(ingress.contains("auth-url: \"http://sessiongate.default.svc.cluster.local/_auth/check\""))
        #expect(ingress.contains("path: /_auth/"))
    }
}
