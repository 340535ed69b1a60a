#include <iostream>
#include <string>

std::string greet(const std::string& who);

int main(int argc, char** argv) {
    std::cout << greet(argc > 1 ? argv[1] : "container") << std::endl;
    return 0;
}
