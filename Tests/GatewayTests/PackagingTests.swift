import Foundation
import Testing
import TestSupport

/// What ships beside the binary: the systemd unit is one systemd accepts, with the promised
/// behaviour and hardening.
@Suite("packaging")
struct PackagingTests {
    @Test("conf/sessiongate.service: systemd-analyze verify accepts it, with reload, restart and hardening")
    func systemdUnit() async throws {
        let unit = try String(contentsOfFile: "\(repositoryRoot)/conf/sessiongate.service", encoding: .utf8)
        for line in ["ExecStart=/usr/local/bin/sessiongate serve --config /etc/sessiongate/sessiongate.yaml", "ExecReload=/usr/local/bin/sessiongate reload --config /etc/sessiongate/sessiongate.yaml",
                     "Type=notify", "NotifyAccess=main",
                     "Restart=on-failure", "User=sessiongate", "NoNewPrivileges=true", "ProtectSystem=strict", "PrivateTmp=true",
                     "ReadOnlyPaths=/etc/sessiongate", "KillSignal=SIGTERM"] {
            #expect(unit.split(separator: "\n").contains { $0 == line }, "\(line)")
        }
        // verify checks that ExecStart's binary exists: point it at the one just built.
        let directory = NSTemporaryDirectory() + "unit-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try unit.replacingOccurrences(of: "/usr/local/bin/sessiongate", with: sessiongateBinary)
            .write(toFile: directory + "/sessiongate.service", atomically: true, encoding: .utf8)
        let verify = try GatewayProcess(arguments: ["verify", directory + "/sessiongate.service"], executable: "/usr/bin/systemd-analyze")
        let status = await verify.waitForExit()
        await verify.waitForOutputEnd()
        #expect(status == 0)
        // Unknown keys are only warnings for systemd: any output is a finding.
        #expect(verify.output.isEmpty, "\(verify.output)")
    }
}
