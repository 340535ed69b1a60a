#include <cmath>
#include <sstream>
#include <string>

std::string greet(const std::string& who) {
    std::ostringstream out;
    out << "hello from rocforge, " << who << " (sqrt(2)=" << std::sqrt(2.0) << ")";
    return out.str();
}
