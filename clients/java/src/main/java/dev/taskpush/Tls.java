package dev.taskpush;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.Base64;
import java.util.Collection;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/** Builds an SSLContext from PEM files, as taskpushd's --tls-* options take them (no keystore needed). */
public final class Tls {
    private Tls() {}

    /**
     * caPem: the CAs that sign the dispatcher's certificate (null: the JDK's); certPem and keyPem:
     * a client certificate for taskpushd --tls-ca (null: none). The key is PKCS#8 ("BEGIN PRIVATE
     * KEY", what openssl writes), EC or RSA.
     */
    public static SSLContext context(Path caPem, Path certPem, Path keyPem) throws IOException, GeneralSecurityException {
        CertificateFactory cf = CertificateFactory.getInstance("X.509");
        TrustManagerFactory tmf = null;
        if (caPem != null) {
            KeyStore trust = KeyStore.getInstance(KeyStore.getDefaultType());
            trust.load(null, null);
            int i = 0;
            for (Certificate c : cf.generateCertificates(new ByteArrayInputStream(Files.readAllBytes(caPem))))
                trust.setCertificateEntry("ca" + i++, c);
            if (i == 0) throw new GeneralSecurityException("no certificate in " + caPem);
            tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            tmf.init(trust);
        }
        KeyManagerFactory kmf = null;
        if (certPem != null) {
            Collection<? extends Certificate> chain = cf.generateCertificates(new ByteArrayInputStream(Files.readAllBytes(certPem)));
            PrivateKey key = privateKey(Files.readString(keyPem));
            KeyStore ks = KeyStore.getInstance("PKCS12");
            ks.load(null, null);
            char[] pw = new char[0];
            ks.setKeyEntry("client", key, pw, chain.toArray(new Certificate[0]));
            kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
            kmf.init(ks, pw);
        }
        SSLContext ctx = SSLContext.getInstance("TLS");
        ctx.init(kmf == null ? null : kmf.getKeyManagers(), tmf == null ? null : tmf.getTrustManagers(), null);
        return ctx;
    }

    static PrivateKey privateKey(String pem) throws GeneralSecurityException {
        String begin = "-----BEGIN PRIVATE KEY-----", end = "-----END PRIVATE KEY-----";
        int b = pem.indexOf(begin), e = pem.indexOf(end);
        if (b < 0 || e < b) throw new GeneralSecurityException("no PKCS#8 PRIVATE KEY block (convert with openssl pkcs8 -topk8 -nocrypt)");
        byte[] der = Base64.getMimeDecoder().decode(pem.substring(b + begin.length(), e));
        PKCS8EncodedKeySpec spec = new PKCS8EncodedKeySpec(der);
        GeneralSecurityException last = null;
        for (String alg : new String[] {"EC", "RSA", "Ed25519"}) {
            try {
                return KeyFactory.getInstance(alg).generatePrivate(spec);
            } catch (GeneralSecurityException x) {
                last = x;
            }
        }
        throw last;
    }
}
