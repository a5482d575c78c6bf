import GatewayConfig
import HTTPProxy
import Logging
import NIOConcurrencyHelpers

/// Configuration reloads (SIGHUP): the whole running configuration swapped as one value, or
/// nothing changed.
extension GatewayService {
    public enum ReloadOutcome: String, Sendable {
        /// The new configuration runs for every new request.
        case applied = "ok"
        /// The file has errors (or names an upstream that does not resolve): nothing changed.
        case invalid
        /// The file changes keys that apply only at restart: nothing changed.
        case refused
    }

    /// Re-reads the configuration file and swaps the whole running configuration (routes, header
    /// rules, identity header names, auth prefix, allow lists, session lifetimes) as one value for
    /// new requests, or changes nothing: an invalid file, or one that changes a key of
    /// `ReloadRules.restartOnly`, keeps the running configuration, each reason logged with its
    /// `file:line:col`.
    @discardableResult
    public func reload() -> ReloadOutcome {
        guard let configPath else { return .invalid }
        // One reload at a time: the generation read, the checks and the swap are one step.
        let outcome = reloading.withLock { attemptReload(configPath) }
        switch outcome {
        case .applied: metrics.reloadsSucceeded.increment()
        case .invalid: metrics.reloadsFailed.increment()
        case .refused: metrics.reloadsRefused.increment()
        }
        return outcome
    }

    /// Called with `reloading` held. Resolves upstream names (blocking): never on an event loop.
    private func attemptReload(_ configPath: String) -> ReloadOutcome {
        let result = GatewayConfiguration.load(file: configPath)
        for problem in result.problems {
            logger.log(level: problem.severity == .error ? .error : .warning, "\(configPath):\(problem)")
        }
        guard let next = result.configuration else {
            logger.error("configuration reload rejected: the file has errors; the running configuration stays",
                         metadata: ["file": "\(configPath)", "errors": "\(result.errors.count)"])
            return .invalid
        }
        let (previous, generation) = running.withLockedValue { ($0.configuration, $0.auth.generation) }
        let refusal = ReloadRules.refusal(running: previous, next: next, locations: result.locations)
            + core.secrets.changed(in: next, locations: result.locations)
        guard refusal.isEmpty else {
            for problem in refusal { logger.error("\(configPath):\(problem)") }
            logger.error("configuration reload refused: keys that apply only at restart changed; the running configuration stays",
                         metadata: ["file": "\(configPath)", "keys": "\(refusal.map(\.path).joined(separator: ","))"])
            return .refused
        }
        let auth: Authenticator
        let routing: RoutingSnapshot
        var certificate: TLSContexts.ServerCertificate? = nil
        do {
            // The certificate is re-read on every reload (certbot renews it in place).
            if let files = next.server.tls { certificate = try TLSContexts.server(files) }
            auth = try Authenticator(core: core, configuration: next, generation: generation + 1)
            routing = try Self.routing(next, auth)
        } catch {
            if let failure = error as? StartupFailure {
                logger.error("\(configPath):\(failure.problem(locations: result.locations))")
            } else {
                logger.error("\(configPath): \(error)")
            }
            logger.error("configuration reload rejected; the running configuration stays", metadata: ["file": "\(configPath)"])
            return .invalid
        }
        metrics.prime(routes: next.routes.map(\.name))
        running.withLockedValue { $0 = (next, auth) }
        proxy.replaceRouting(routing)
        if let certificate {
            tls?.replace(certificate.context)
            metrics.recordCertificateExpiry(certificate.notValidAfter)
            if let warning = certificate.warning { logger.warning("server.tls.certificate_file: \(warning)") }
        }
        logger.info("configuration reloaded", metadata: ["file": "\(configPath)", "routes": "\(next.routes.count)"])
        return .applied
    }
}
